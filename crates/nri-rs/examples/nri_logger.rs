//! An NRI plugin built on `nri_rs` that logs pod sandbox events and can refuse
//! containers of chosen pods.
//!
//! Every event goes to stdout as one line starting with `EVENT` (the containerd e2e test reads
//! them); pod events end with `via=<entry>`, the runtime call that delivered them
//! (`state_change` or `pod_sandbox_call`, [`nri_rs::EventEntry`]); diagnostics go to stderr.
//!
//! ```text
//! nri_logger --socket /var/run/nri/nri.sock --index 10 --refuse-pod blocked-pod
//! ```

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use nri_rs::{
    Container, Event, EventMask, HandlerError, Plugin, PluginHandler, PluginOptions, PluginStatus,
    PodSandbox,
};
use tokio_util::sync::CancellationToken;

/// Logs NRI pod sandbox events; refuses containers of the named pods.
#[derive(Parser)]
struct Args {
    /// The runtime's NRI socket.
    #[arg(long, default_value = nri_rs::plugin::DEFAULT_SOCKET_PATH)]
    socket: PathBuf,
    /// Plugin name.
    #[arg(long, default_value = "nri-logger")]
    name: String,
    /// Plugin index (two digits).
    #[arg(long, default_value = "50")]
    index: String,
    /// Refuse `CreateContainer` for pods with this name (repeatable).
    #[arg(long = "refuse-pod")]
    refuse_pods: Vec<String>,
    /// Longest wait between reconnect attempts, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    reconnect_max_ms: u64,
}

/// Writes one `EVENT` line and flushes, so a reader sees it at once.
fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "EVENT {line}");
    let _ = out.flush();
}

/// `state_change` or `pod_sandbox_call`: how the runtime delivered the event being handled.
fn via() -> &'static str {
    nri_rs::event_entry().map_or("unknown", nri_rs::EventEntry::as_str)
}

fn netns(pod: &PodSandbox) -> String {
    pod.netns_path.as_ref().map_or_else(String::new, |p| p.display().to_string())
}

struct Logger {
    refuse_pods: BTreeSet<String>,
}

impl PluginHandler for Logger {
    async fn synchronize(&self, pods: Vec<PodSandbox>) -> Result<(), HandlerError> {
        let names: Vec<_> = pods.iter().map(|p| p.name.as_str()).collect();
        emit(&format!("synchronize pods={} names={}", pods.len(), names.join(",")));
        Ok(())
    }

    async fn run_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        emit(&format!(
            "run_pod_sandbox pod={}/{} uid={} id={} netns={} via={}",
            pod.namespace,
            pod.name,
            pod.uid,
            pod.id,
            netns(&pod),
            via()
        ));
        Ok(())
    }

    async fn stop_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        emit(&format!(
            "stop_pod_sandbox pod={}/{} uid={} netns={} via={}",
            pod.namespace,
            pod.name,
            pod.uid,
            netns(&pod),
            via()
        ));
        Ok(())
    }

    async fn remove_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        emit(&format!(
            "remove_pod_sandbox pod={}/{} uid={} via={}",
            pod.namespace,
            pod.name,
            pod.uid,
            via()
        ));
        Ok(())
    }

    async fn create_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> Result<(), HandlerError> {
        let refused = self.refuse_pods.contains(&pod.name);
        emit(&format!(
            "create_container pod={}/{} container={} refused={refused}",
            pod.namespace, pod.name, container.name
        ));
        if refused {
            return Err(HandlerError::new(format!(
                "nri-logger refuses containers of pod {}/{}",
                pod.namespace, pod.name
            )));
        }
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let options = PluginOptions::new(args.name, args.index)?
        .socket_path(args.socket)
        .events(EventMask::POD_SANDBOX_LIFECYCLE.with(Event::CreateContainer))
        .reconnect_backoff(
            Duration::from_millis(100),
            Duration::from_millis(args.reconnect_max_ms),
        );
    let handler = Arc::new(Logger { refuse_pods: args.refuse_pods.into_iter().collect() });
    let plugin = Plugin::new(handler, options);

    let mut status = plugin.status();
    tokio::spawn(async move {
        while status.changed().await.is_ok() {
            let line = match &*status.borrow_and_update() {
                PluginStatus::Disconnected => "status disconnected".to_owned(),
                PluginStatus::Registered => "status registered".to_owned(),
                PluginStatus::Configured(rt) => format!(
                    "status configured runtime={} version={} nri={} events={:#x} timeout_ms={}",
                    rt.name,
                    rt.version,
                    rt.nri_version,
                    rt.events.0,
                    rt.request_timeout.as_millis()
                ),
                PluginStatus::Synchronized(_) => "status synchronized".to_owned(),
            };
            emit(&line);
        }
    });

    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing a SIGTERM handler only fails outside a runtime");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        on_signal.cancel();
    });
    plugin.run(shutdown).await;
    emit("exit");
    Ok(())
}
