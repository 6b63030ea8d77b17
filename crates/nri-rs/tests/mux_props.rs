//! The multiplexer over outside bytes: whatever a peer sends (random bytes, frames for
//! unknown connections, lengths past the limit, a stream cut anywhere), the mux never panics,
//! never buffers a frame larger than its limit, and ends with every logical connection seeing
//! the end of its stream.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::time::Duration;

use nri_rs::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One frame as a peer might send it: connection id, declared length, actual payload.
fn frame() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(1u32), Just(2u32), any::<u32>()],
        prop_oneof![Just(None), Just(Some(u32::MAX)), any::<u32>().prop_map(Some)],
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(conn, declared, payload)| {
            let len = declared.unwrap_or(u32::try_from(payload.len()).unwrap());
            let mut bytes = conn.to_be_bytes().to_vec();
            bytes.extend_from_slice(&len.to_be_bytes());
            bytes.extend_from_slice(&payload);
            bytes
        })
}

fn run(stream: Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async move {
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let mux = Mux::new(ours);
        let plugin = mux.open(PLUGIN_SERVICE_CONN).unwrap();
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN).unwrap();
        let writer = tokio::spawn(async move {
            let _ = theirs.write_all(&stream).await;
            let _ = theirs.shutdown().await;
            // Keep our end open for a moment, then drop it: the mux sees EOF.
            tokio::time::sleep(Duration::from_millis(10)).await;
        });
        let drain = |mut conn: nri_rs::mux::MuxConn| async move {
            let mut sink = Vec::new();
            let _ = conn.read_to_end(&mut sink).await;
        };
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            tokio::join!(drain(plugin), drain(runtime_conn));
        })
        .await;
        assert!(ended.is_ok(), "a logical connection never saw the end of its stream");
        let closed = tokio::time::timeout(Duration::from_secs(10), mux.closed()).await;
        assert!(closed.is_ok(), "the mux never reported its end");
        if let Ok(Err(err)) = closed {
            assert!(!err.to_string().is_empty());
        }
        writer.await.unwrap();
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_bytes_end_the_mux_cleanly(stream in proptest::collection::vec(any::<u8>(), 0..2048)) {
        run(stream);
    }

    #[test]
    fn random_frames_end_the_mux_cleanly(
        frames in proptest::collection::vec(frame(), 0..10),
        cut in any::<usize>(),
    ) {
        let mut stream: Vec<u8> = frames.concat();
        let cut = cut % (stream.len() + 1);
        stream.truncate(cut.max(stream.len() / 2));
        run(stream);
    }
}
