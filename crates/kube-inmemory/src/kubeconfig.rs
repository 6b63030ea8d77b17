//! Writes the kubeconfig that points clients (kubectl, the node daemon) at the dev API
//! server: plain HTTP on loopback, with the server's bearer token when it has one.

use std::path::{Path, PathBuf};

/// Errors writing a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The file could not be written.
    #[error("writing kubeconfig {path}")]
    Write {
        /// Destination.
        path: PathBuf,
        /// Why (a step and its OS error, or what was refused at the path).
        #[source]
        source: safe_file::SafeFileError,
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

/// Writes the kubeconfig atomically, mode 0600 from its first byte (it holds the token),
/// through a random `O_EXCL` temporary renamed over `path`: the README's
/// `--kubeconfig-out /tmp/netclaim.kubeconfig` lands in a directory every local user writes
/// to, where a file or symlink planted at a guessable temporary name would have received the
/// token or had its target truncated. A symlink at `path` itself is replaced, not followed.
pub fn write(path: &Path, server_url: &str, token: Option<&str>) -> Result<(), KubeconfigError> {
    let contents = render(server_url, token);
    safe_file::replace(path, contents.as_bytes(), safe_file::Options::mode(0o600).synced())
        .map_err(|source| KubeconfigError::Write { path: path.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use super::*;

    #[test]
    fn written_file_parses_as_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        write(&path, "http://127.0.0.1:1234", Some("s3cr3t")).unwrap();
        let v: serde_json::Value =
            yaml_serde::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["clusters"][0]["cluster"]["server"], "http://127.0.0.1:1234");
        assert_eq!(v["current-context"], "netclaim-dev");
        assert_eq!(v["users"][0]["user"]["token"], "s3cr3t");
    }

    /// The file names a writer could guess next to `path`: the old `<out>.tmp` scheme's.
    fn guessable_temporaries(path: &Path) -> Vec<std::path::PathBuf> {
        vec![path.with_extension("tmp"), path.with_extension("kubeconfig.tmp")]
    }

    /// Another local user pre-created the temporary (the README's `/tmp/netclaim.kubeconfig`
    /// next to `/tmp/netclaim.tmp`): the token must not land in their file.
    #[test]
    fn a_hostile_file_at_a_guessable_temporary_never_receives_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("netclaim.kubeconfig");
        for hostile in guessable_temporaries(&path) {
            std::fs::write(&hostile, b"attacker's").unwrap();
            std::fs::set_permissions(&hostile, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        write(&path, "http://127.0.0.1:1234", Some("s3cr3t")).unwrap();
        for hostile in guessable_temporaries(&path) {
            assert_eq!(std::fs::read(&hostile).unwrap(), b"attacker's", "{}", hostile.display());
        }
        assert!(std::fs::read_to_string(&path).unwrap().contains("s3cr3t"));
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    }

    /// A symlink at the guessable temporary or at the target itself is never followed: the
    /// file it points to keeps its contents, and the kubeconfig is a file of its own, 0600.
    #[test]
    fn a_symlink_at_the_temporary_or_the_target_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join("netclaim.kubeconfig");
        for link in guessable_temporaries(&path).into_iter().chain([path.clone()]) {
            std::os::unix::fs::symlink(&victim, &link).unwrap();
        }
        write(&path, "http://127.0.0.1:1234", Some("s3cr3t")).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file(), "{meta:?}");
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert!(std::fs::read_to_string(&path).unwrap().contains("s3cr3t"));
    }
}
