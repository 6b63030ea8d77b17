//! The one-file installs (`deploy/install.yaml` from deploy/base, `deploy/install-<overlay>.yaml`
//! from each deploy/overlays/<overlay>, written by scripts/render-install.sh) hold exactly what
//! `kubectl kustomize` renders from their kustomization today, and the image is named in one
//! place only: the `images:` entry of deploy/base/kustomization.yaml.
//!
//! The comparison is of the parsed objects, in order, not of the text: a kubectl with another
//! kustomize may indent differently, and that is no drift.
//!
//! The rendering test is `#[ignore]`d: it needs kubectl (scripts/setup/kubectl.sh; `make test`
//! installs it).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde_json::Value;

use crate::kit::kustomize::kustomize as render;

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// (rendered file, the kustomization it comes from): the base, then every overlay, as
/// scripts/render-install.sh writes them.
fn installs() -> Vec<(PathBuf, PathBuf)> {
    let mut out = vec![(deploy().join("install.yaml"), deploy().join("base"))];
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(deploy().join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").exists())
        .collect();
    overlays.sort();
    for overlay in overlays {
        let name = overlay.file_name().unwrap().to_string_lossy().into_owned();
        out.push((deploy().join(format!("install-{name}.yaml")), overlay));
    }
    out
}

fn parse(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|err| panic!("{}: {err}; run scripts/render-install.sh", file.display()));
    yaml_serde::Deserializer::from_str(&text)
        .map(|document| Value::deserialize(document).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn describe(object: &Value) -> String {
    format!("{} {}", object["kind"].as_str().unwrap_or("?"), object["metadata"]["name"])
}

#[test]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
fn each_install_file_is_what_its_kustomization_renders() {
    let installs = installs();
    assert!(installs.len() >= 3, "the base and the overlays k8s-1.34 and slots: {installs:?}");
    for (file, dir) in &installs {
        let rendered = render(dir);
        let stored = parse(file);
        let stale = format!(
            "{} differs from `kubectl kustomize {}`: run scripts/render-install.sh",
            file.display(),
            dir.display()
        );
        // The first object that differs, named, before the counts: that is what a reader
        // needs to see which change was not rendered.
        for (stored, rendered) in stored.iter().zip(&rendered) {
            assert_eq!(stored, rendered, "{stale}: first difference at {}", describe(rendered));
        }
        assert_eq!(stored.len(), rendered.len(), "{stale}: object count");
    }
    // No rendered file without its kustomization (a removed overlay's file left behind).
    let expected: Vec<&PathBuf> = installs.iter().map(|(file, _)| file).collect();
    for entry in std::fs::read_dir(deploy()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("install") && path.extension().is_some_and(|e| e == "yaml") {
            assert!(expected.contains(&&path), "{name} has no kustomization under deploy/overlays");
        }
    }
}

/// Every `*.yaml` file below `dir`, recursively.
fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

#[test]
fn the_image_is_named_in_one_place() {
    let mut files = Vec::new();
    for dir in ["base", "crds", "overlays", "monitoring"] {
        yaml_files(&deploy().join(dir), &mut files);
    }
    let mut images_entries = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            if let Some(image) = line.trim().strip_prefix("image:") {
                assert_eq!(
                    image.trim(),
                    "netclaim",
                    "{}: the workloads name the placeholder `netclaim`; the image itself is set \
                     by the images: entry of deploy/base/kustomization.yaml",
                    file.display()
                );
            }
            if line.starts_with("images:") {
                images_entries.push(file.clone());
            }
        }
    }
    assert_eq!(
        images_entries,
        [deploy().join("base/kustomization.yaml")],
        "exactly one kustomization sets the image"
    );
    let base: Value = yaml_serde::from_str(
        &std::fs::read_to_string(deploy().join("base/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    let images = base["images"].as_array().unwrap();
    assert_eq!(images.len(), 1, "{images:?}");
    assert_eq!(images[0]["name"], "netclaim");
    assert_eq!(images[0]["newName"], "localhost/netclaim", "the name `make image` gives");
    assert_eq!(images[0]["newTag"], env!("CARGO_PKG_VERSION"), "the crate's version");
}
