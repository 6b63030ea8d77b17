#!/usr/bin/env python3
"""Writes a single-layer OCI image-layout tar that `ctr images import` accepts, with no registry.

usage: oci_image.py OUT.tar IMAGE_REF ENTRYPOINT FILE=PATH_IN_IMAGE...

The layer holds the given files (mode 0755) and a few empty directories runtimes expect;
the image is linux/amd64 and the reference goes into the index's
`io.containerd.image.name` annotation, which is what ctr uses to name the import.
"""
import hashlib
import io
import json
import sys
import tarfile


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_entry(tar, name, data=None, mode=0o755, kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = 0
    if data is not None:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        tar.addfile(info)


def build_layer(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = {"dev", "etc", "proc", "sys", "tmp"}
        for _, dest in files:
            parts = dest.strip("/").split("/")[:-1]
            dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        for d in sorted(dirs):
            tar_entry(tar, d, mode=0o1777 if d == "tmp" else 0o755, kind=tarfile.DIRTYPE)
        for src, dest in files:
            with open(src, "rb") as f:
                tar_entry(tar, dest.strip("/"), f.read())
    return buf.getvalue()


def main(argv):
    if len(argv) < 5:
        sys.exit(__doc__)
    out, ref, entrypoint = argv[1], argv[2], argv[3]
    files = [tuple(arg.split("=", 1)) for arg in argv[4:]]
    layer = build_layer(files)
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Entrypoint": [entrypoint], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest(layer), "size": len(layer)}],
    }, sort_keys=True).encode()
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(manifest), "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1]},
        }],
    }).encode()
    with tarfile.open(out, "w") as tar:
        tar_entry(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', mode=0o644)
        tar_entry(tar, "index.json", index, mode=0o644)
        for blob in (layer, config, manifest):
            tar_entry(tar, "blobs/sha256/" + digest(blob)[7:], blob, mode=0o644)


if __name__ == "__main__":
    main(sys.argv)
