//! The image `make image` writes (target/image/netclaim-<version>.oci.tar) against the
//! Dockerfile: a valid OCI image layout whose config is the runtime stage's (entrypoint, env,
//! user, labels, exposed ports, read from the Dockerfile, not repeated here), whose layer
//! holds the binary, the shared objects `ldd` lists for it, the packages' copyright files and
//! nothing else (no shell, no package manager), built with the builder stage's cargo flags;
//! and containerd imports it and runs it.
//!
//! `#[ignore]`d: they need the archive (`make image`, which `make test` runs first); the
//! containerd one also needs root and scripts/setup/containerd.sh.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::kit;
use crate::kit::image::{Dockerfile, archive, image_ref};
use crate::kit::repo;

/// The archive unpacked into a temp dir, its layer too.
struct Unpacked {
    dir: tempfile::TempDir,
    config: Value,
}

impl Unpacked {
    fn blob(&self, digest: &str) -> Vec<u8> {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digests");
        std::fs::read(self.dir.path().join("blobs/sha256").join(hex)).unwrap()
    }

    fn rootfs(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(data))
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Unpacks the archive and checks the layout's own rules: `oci-layout`, an index naming one
/// manifest with our image name, every blob stored under its sha256 with the size its
/// descriptor says, the config's `diff_ids` the digests of the uncompressed layers.
fn unpack() -> Unpacked {
    let dir = tempfile::tempdir().unwrap();
    run(Command::new("tar").arg("-xf").arg(archive()).arg("-C").arg(dir.path()));
    let layout: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("oci-layout")).unwrap()).unwrap();
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    for entry in std::fs::read_dir(dir.path().join("blobs/sha256")).unwrap() {
        let entry = entry.unwrap();
        let data = std::fs::read(entry.path()).unwrap();
        assert_eq!(
            sha256(&data),
            format!("sha256:{}", entry.file_name().to_string_lossy()),
            "a blob is stored under its digest"
        );
    }
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).unwrap()).unwrap();
    assert_eq!(index["schemaVersion"], 2);
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "one image in the archive");
    let descriptor = &manifests[0];
    assert_eq!(descriptor["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(descriptor["annotations"]["io.containerd.image.name"], image_ref().as_str());
    assert_eq!(descriptor["platform"]["os"], "linux");
    assert_eq!(descriptor["platform"]["architecture"], "amd64");
    let mut unpacked = Unpacked { dir, config: Value::Null };
    let manifest_bytes = unpacked.blob(descriptor["digest"].as_str().unwrap());
    assert_eq!(descriptor["size"].as_u64().unwrap(), manifest_bytes.len() as u64);
    let manifest: Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
    let config_bytes = unpacked.blob(manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(manifest["config"]["size"].as_u64().unwrap(), config_bytes.len() as u64);
    let config: Value = serde_json::from_slice(&config_bytes).unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    let layers = manifest["layers"].as_array().unwrap();
    let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
    assert!(!layers.is_empty(), "at least one layer");
    assert_eq!(layers.len(), diff_ids.len(), "one diff_id per layer");
    let rootfs = unpacked.rootfs();
    std::fs::create_dir(&rootfs).unwrap();
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        assert_eq!(layer["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip");
        let compressed = unpacked.blob(layer["digest"].as_str().unwrap());
        assert_eq!(layer["size"].as_u64().unwrap(), compressed.len() as u64);
        let path = unpacked.dir.path().join("layer.tar.gz");
        std::fs::write(&path, &compressed).unwrap();
        let tar = Command::new("gzip").arg("-dc").arg(&path).output().unwrap();
        assert!(tar.status.success(), "the layer is gzip");
        assert_eq!(diff_id.as_str().unwrap(), sha256(&tar.stdout), "diff_id of the layer");
        run(Command::new("tar").arg("-xzf").arg(&path).arg("-C").arg(&rootfs));
        std::fs::remove_file(&path).unwrap();
    }
    unpacked.config = config;
    unpacked
}

/// The shared objects `ldd` lists for `binary` (paths, the loader included, no vDSO).
fn ldd(binary: &Path) -> Vec<String> {
    run(Command::new("ldd").arg(binary))
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [_, "=>", path, ..] | [path, ..] if path.starts_with('/') => {
                    Some((*path).to_owned())
                }
                _ => None,
            }
        })
        .collect()
}

/// `path` as the image has it: as given, or with `/usr` added or dropped (a merged-/usr host
/// names /usr/lib where Debian's packages ship /lib, or the reverse).
fn in_image(rootfs: &Path, path: &str) -> Option<String> {
    let other = path.strip_prefix("/usr").map_or_else(|| format!("/usr{path}"), str::to_owned);
    [path.to_owned(), other]
        .into_iter()
        .find(|p| rootfs.join(p.trim_start_matches('/')).symlink_metadata().is_ok())
}

/// Every path under `rootfs` that is not a directory, relative, with `/` in front.
fn files(rootfs: &Path) -> BTreeSet<String> {
    fn walk(dir: &Path, rootfs: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = path.symlink_metadata().unwrap();
            if meta.is_dir() {
                walk(&path, rootfs, out);
            } else {
                out.insert(format!("/{}", path.strip_prefix(rootfs).unwrap().display()));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(rootfs, rootfs, &mut out);
    out
}

#[test]
#[ignore = "needs the image archive: run `make image` (make test does)"]
fn the_archive_is_an_oci_layout_with_the_dockerfile_runtime_config() {
    let unpacked = unpack();
    let dockerfile =
        Dockerfile::read(&repo().join("Dockerfile"), &[("VERSION", env!("CARGO_PKG_VERSION"))]);
    let runtime = dockerfile.stage("runtime");
    assert_eq!(runtime.from, "scratch", "the runtime stage starts from nothing");
    let config = &unpacked.config["config"];

    let strings = |value: &Value| -> Option<Vec<String>> {
        value.as_array().map(|items| items.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
    };
    assert_eq!(strings(&config["Entrypoint"]), runtime.entrypoint, "Entrypoint");
    assert_eq!(strings(&config["Cmd"]), runtime.cmd, "Cmd");
    let env: Vec<String> = runtime.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    assert_eq!(strings(&config["Env"]).unwrap_or_default(), env, "Env");
    assert_eq!(config["User"].as_str().map(str::to_owned), runtime.user, "User");
    assert_eq!(config["WorkingDir"].as_str().map(str::to_owned), runtime.workdir, "WorkingDir");
    let labels: BTreeMap<String, String> = config["Labels"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect())
        .unwrap_or_default();
    assert_eq!(labels, runtime.labels, "Labels");
    assert_eq!(
        labels.get("org.opencontainers.image.version").map(String::as_str),
        Some(env!("CARGO_PKG_VERSION")),
        "the version label carries the crate's version"
    );
    let ports: BTreeSet<String> =
        config["ExposedPorts"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
    assert_eq!(ports, runtime.ports.iter().cloned().collect(), "ExposedPorts");
    let entrypoint = runtime.entrypoint.as_ref().expect("the Dockerfile sets an ENTRYPOINT");
    let rootfs = unpacked.rootfs();
    assert!(
        rootfs.join(entrypoint[0].trim_start_matches('/')).is_file(),
        "the entrypoint {} is in the image",
        entrypoint[0]
    );
}

#[test]
#[ignore = "needs the image archive: run `make image` (make test does)"]
fn the_image_holds_the_binary_its_libraries_and_nothing_else() {
    let unpacked = unpack();
    let rootfs = unpacked.rootfs();
    let binary = rootfs.join("usr/bin/netclaim");
    // What the daemon needs: the binary, each shared object ldd lists with the symlinks that
    // lead to it (the loader's /lib64 link), and the packages' copyright files.
    let mut needed = BTreeSet::from(["/usr/bin/netclaim".to_owned()]);
    let libraries = ldd(&binary);
    assert!(!libraries.is_empty(), "a dynamically linked binary");
    for library in &libraries {
        let mut path = in_image(&rootfs, library)
            .unwrap_or_else(|| panic!("ldd lists {library}, which the image lacks"));
        // Follow the symlinks inside the image.
        for _ in 0..16 {
            needed.insert(path.clone());
            let on_disk = rootfs.join(path.trim_start_matches('/'));
            let Ok(target) = std::fs::read_link(&on_disk) else { break };
            path = if target.is_absolute() {
                target.display().to_string()
            } else {
                let parent = Path::new(&path).parent().unwrap();
                normalize(&parent.join(target))
            };
        }
    }
    let present = files(&rootfs);
    let extra: Vec<&String> = present
        .iter()
        .filter(|p| !needed.contains(*p))
        .filter(|p| !(p.starts_with("/usr/share/doc/") && p.ends_with("/copyright")))
        .collect();
    assert!(extra.is_empty(), "the image holds files the daemon does not need: {extra:?}");
    let missing: Vec<&String> = needed.iter().filter(|p| !present.contains(*p)).collect();
    assert!(missing.is_empty(), "missing from the image: {missing:?}");
    for tool in ["sh", "bash", "dash", "busybox", "apt", "apt-get", "dpkg", "ldconfig"] {
        assert!(
            !present.iter().any(|p| p.rsplit('/').next() == Some(tool)),
            "the image carries {tool}"
        );
    }
    // --no-default-features: no `netclaim dev` in the image.
    let dev = Command::new(&binary).args(["dev", "--help"]).output().unwrap();
    assert_eq!(dev.status.code(), Some(2), "the image's binary has no `dev` subcommand");
    // The libraries in the image are enough to run it: run it with the image as its root.
    if std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        let out = run(Command::new("chroot").arg(&rootfs).args(["/usr/bin/netclaim", "version"]));
        assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    }
}

/// `a/b/../c` → `a/c` (no file system access: the path is inside the image).
fn normalize(path: &Path) -> String {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in path.components() {
        match component {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(part) => parts.push(part),
            _ => {}
        }
    }
    let joined: PathBuf = parts.iter().collect();
    format!("/{}", joined.display())
}

/// The flags of a `cargo build` command line (`$(CARGO)` or `cargo`), sorted.
fn cargo_build_flags(line: &str) -> BTreeSet<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .windows(2)
        .position(|w| (w[0] == "cargo" || w[0] == "$(CARGO)") && w[1] == "build")
        .unwrap_or_else(|| panic!("no cargo build in {line:?}"));
    words[at + 2..].iter().take_while(|w| **w != "&&").map(|w| (*w).to_owned()).collect()
}

#[test]
fn make_image_builds_the_binary_with_the_dockerfile_builder_flags() {
    let dockerfile = Dockerfile::read(&repo().join("Dockerfile"), &[]);
    let builder = dockerfile.stage("builder");
    let docker_build = builder
        .runs
        .iter()
        .find(|r| r.contains("cargo build"))
        .expect("the builder stage runs cargo build");
    let makefile = std::fs::read_to_string(repo().join("Makefile")).unwrap();
    let recipe: Vec<&str> = makefile
        .lines()
        .skip_while(|l| !l.starts_with("image:"))
        .skip(1)
        .take_while(|l| l.starts_with('\t'))
        .collect();
    let make_build = recipe
        .iter()
        .find(|l| l.contains("build") && l.contains("CARGO"))
        .expect("make image runs cargo build");
    let flags = cargo_build_flags(docker_build);
    assert_eq!(cargo_build_flags(make_build), flags, "make image and the Dockerfile build alike");
    assert!(flags.contains("--no-default-features") && flags.contains("--release"), "{flags:?}");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs root, containerd (scripts/setup/containerd.sh) and the image archive (make image): run `make test` as root"]
async fn containerd_imports_and_runs_the_image() {
    let archive = archive();
    let tools = kit::containerd::find_tools().unwrap();
    let ctr = tools.ctr.clone();
    let mut containerd = kit::containerd::Containerd::new(tools, Duration::from_secs(2));
    containerd.start();
    let _cri = containerd.cri(Duration::from_secs(10)).await;
    let socket = containerd.cri_socket();
    let ctr_cmd = |args: &[&str]| {
        let mut command = Command::new(&ctr);
        command.arg("--address").arg(&socket).args(["-n", "k8s.io"]).args(args);
        command
    };
    run(ctr_cmd(&["images", "import", "--platform", "linux/amd64"]).arg(&archive));
    let listed = run(&mut ctr_cmd(&["images", "ls", "-q"]));
    assert!(listed.lines().any(|l| l == image_ref()), "{} not in {listed}", image_ref());
    // Unpacked onto the snapshotter and started by runc: the entrypoint with `version`.
    let name = format!("netclaim-image-{}", std::process::id());
    let out =
        run(&mut ctr_cmd(&["run", "--rm", &image_ref(), &name, "/usr/bin/netclaim", "version"]));
    assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    println!(
        "imported and ran {} ({} bytes)",
        image_ref(),
        std::fs::metadata(&archive).unwrap().len()
    );
}
