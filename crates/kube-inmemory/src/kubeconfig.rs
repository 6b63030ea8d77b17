//! Writes the kubeconfig that points clients (kubectl, the node daemon) at the dev API
//! server: plain HTTP on loopback, with the server's bearer token when it has one.

use std::path::{Path, PathBuf};

/// Errors writing a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The file could not be written.
    #[error("writing kubeconfig {path}: {source}")]
    Write {
        /// Destination.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
}

/// The kubeconfig document for `server_url` (context, cluster and user named `netclaim-dev`,
/// namespace `default`), with `token` as the user's bearer token.
#[must_use]
pub fn render(server_url: &str, token: Option<&str>) -> String {
    let user = token.map_or_else(|| "{}".to_owned(), |t| format!("{{token: \"{t}\"}}"));
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: netclaim-dev\n  cluster:\n    server: {server_url}\ncontexts:\n- name: netclaim-dev\n  context:\n    cluster: netclaim-dev\n    user: netclaim-dev\n    namespace: default\ncurrent-context: netclaim-dev\nusers:\n- name: netclaim-dev\n  user: {user}\npreferences: {{}}\n"
    )
}

/// Writes the kubeconfig atomically (temp file + rename, mode 0600: it holds the token).
pub fn write(path: &Path, server_url: &str, token: Option<&str>) -> Result<(), KubeconfigError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |source| KubeconfigError::Write { path: path.to_owned(), source };
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(render(server_url, token).as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_file_parses_as_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        write(&path, "http://127.0.0.1:1234", Some("s3cr3t")).unwrap();
        let v: serde_json::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["clusters"][0]["cluster"]["server"], "http://127.0.0.1:1234");
        assert_eq!(v["current-context"], "netclaim-dev");
        assert_eq!(v["users"][0]["user"]["token"], "s3cr3t");
    }
}
