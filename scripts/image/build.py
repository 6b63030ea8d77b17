#!/usr/bin/env python3
"""Builds the Dockerfile's `runtime` stage without Docker or a registry (`make image`).

usage: build.py --binary PATH [--out DIR] [--dockerfile PATH] [--name NAME]

1. Reads the Dockerfile: the global ARG RUNTIME_PACKAGES and the runtime stage's config
   (ENTRYPOINT, CMD, ENV, USER, WORKDIR, EXPOSE, LABEL, STOPSIGNAL), with ARGs substituted
   (VERSION is the crate's version from Cargo.toml).
2. Downloads those Debian bookworm packages with a private apt state under OUT/apt (the
   machine's own apt sources stay as they are).
3. Lays out the root file system with scripts/image/rootfs.sh, as the Dockerfile's
   `runtime-files` stage does.
4. Writes OUT/netclaim-<version>.oci.tar: an OCI image layout (oci-layout, index.json, the
   manifest, the config and one gzip layer, all sha256-addressed) that `ctr images import`
   takes, named NAME:<version> (default localhost/netclaim).

Reproducible: tar entries sorted with fixed owners and mtimes, gzip without a timestamp, the
config's `created` from SOURCE_DATE_EPOCH or else the HEAD commit's time. Only the standard
library is used.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITES = [
    ("http://deb.debian.org/debian", "bookworm"),
    ("http://deb.debian.org/debian", "bookworm-updates"),
    ("http://deb.debian.org/debian-security", "bookworm-security"),
]


def fail(message):
    sys.exit(f"image: {message}")


# --- Dockerfile -------------------------------------------------------------------------


def instructions(text):
    """(keyword, arguments) per instruction, continuation lines joined, comments dropped."""
    result, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.partition(" ")
        result.append((keyword.upper(), rest.strip()))
        current = ""
    if current:
        fail("the Dockerfile ends inside a continued line")
    return result


def substitute(value, args):
    def replace(match):
        name = match.group(1) or match.group(2)
        if name not in args:
            fail(f"the Dockerfile uses ${name}, which no ARG declares")
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, value)


def key_values(text, args):
    """`k=v k2="v 2"` (shell-quoted) as pairs, values substituted."""
    pairs = []
    for word in shlex.split(text):
        key, sep, value = word.partition("=")
        if not sep:
            fail(f"expected KEY=VALUE in {text!r}")
        pairs.append((key, substitute(value, args)))
    return pairs


def parse_dockerfile(path, build_args):
    """The global ARG defaults and the runtime stage's image config."""
    global_args, stage, stages = {}, None, {}
    for keyword, rest in instructions(path.read_text()):
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stage = {"args": {}, "config": {}, "env": [], "labels": {}, "ports": []}
            stages[name] = stage
            continue
        if keyword == "ARG":
            name, sep, default = rest.partition("=")
            default = shlex.split(default)[0] if sep else None
            if stage is None:
                global_args[name] = default
            else:
                value = build_args.get(name, default if sep else global_args.get(name))
                if value is None:
                    fail(f"ARG {name} of a stage has no value")
                stage["args"][name] = value
            continue
        if stage is None:
            fail(f"{keyword} before the first FROM")
        args = stage["args"]
        if keyword == "ENV":
            for key, value in key_values(rest, args):
                stage["env"] = [e for e in stage["env"] if not e.startswith(key + "=")]
                stage["env"].append(f"{key}={value}")
        elif keyword == "LABEL":
            stage["labels"].update(key_values(rest, args))
        elif keyword == "EXPOSE":
            for port in rest.split():
                stage["ports"].append(port if "/" in port else port + "/tcp")
        elif keyword in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                fail(f"{keyword} must be the exec (JSON) form: the image has no shell")
            stage["config"]["Entrypoint" if keyword == "ENTRYPOINT" else "Cmd"] = value
        elif keyword in ("USER", "WORKDIR", "STOPSIGNAL"):
            name = {"USER": "User", "WORKDIR": "WorkingDir", "STOPSIGNAL": "StopSignal"}[keyword]
            stage["config"][name] = substitute(rest, args)
    if "runtime" not in stages:
        fail(f"{path} has no stage named runtime")
    runtime = stages["runtime"]
    config = dict(runtime["config"])
    if runtime["env"]:
        config["Env"] = runtime["env"]
    if runtime["labels"]:
        config["Labels"] = runtime["labels"]
    if runtime["ports"]:
        config["ExposedPorts"] = {port: {} for port in runtime["ports"]}
    packages = (global_args.get("RUNTIME_PACKAGES") or "").split()
    if not packages:
        fail("the Dockerfile declares no ARG RUNTIME_PACKAGES")
    return packages, config


# --- packages ----------------------------------------------------------------------------


def retry(command, attempts=5, cwd=None):
    """Runs `command` until it succeeds: another apt may hold the lock for a moment."""
    for attempt in range(1, attempts + 1):
        if subprocess.run(command, cwd=cwd).returncode == 0:
            return
        print(f"image: attempt {attempt} of {shlex.join(command)} failed", file=sys.stderr)
        time.sleep(3)
    fail(f"{shlex.join(command)} failed {attempts} times")


def download(packages, apt_dir, debs):
    """Downloads `packages` from Debian bookworm with a private apt state in `apt_dir`."""
    (apt_dir / "lists/partial").mkdir(parents=True, exist_ok=True)
    (apt_dir / "cache/archives/partial").mkdir(parents=True, exist_ok=True)
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    if not Path(keyring).exists():
        fail(f"{keyring} is missing: apt-get install debian-archive-keyring")
    (apt_dir / "sources.list").write_text(
        "".join(f"deb [signed-by={keyring}] {url} {suite} main\n" for url, suite in SUITES)
    )
    options = [
        "-o", f"Dir::Etc::sourcelist={apt_dir / 'sources.list'}",
        "-o", "Dir::Etc::sourceparts=/dev/null",
        "-o", f"Dir::State::Lists={apt_dir / 'lists'}",
        "-o", f"Dir::Cache={apt_dir / 'cache'}",
        "-o", "APT::Architecture=amd64",
    ]
    retry(["apt-get", *options, "-qq", "update"])
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    # apt's sandbox user (_apt) cannot write into a root-owned directory: download as root.
    retry(["apt-get", *options, "-qq", "-o", "APT::Sandbox::User=root", "download", *packages],
          cwd=debs)
    return sorted(p.name for p in debs.glob("*.deb"))


# --- OCI layout ----------------------------------------------------------------------------


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(rootfs, mtime):
    """The root file system as a tar: sorted, owned by 0:0, fixed mtimes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(rootfs.rglob("*"), key=lambda p: p.relative_to(rootfs).as_posix()):
            name = path.relative_to(rootfs).as_posix()
            info = tar.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = mtime
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def write_archive(out, ref, tag, config, layer, created):
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(layer)
    compressed = compressed.getvalue()
    image_config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
        "history": [{"created": created, "created_by": "make image (scripts/image/build.py)"}],
    }, sort_keys=True, separators=(",", ":")).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(image_config), "size": len(image_config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": digest(compressed), "size": len(compressed)}],
        "annotations": {"org.opencontainers.image.created": created},
    }, sort_keys=True, separators=(",", ":")).encode()
    index = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(manifest), "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": tag},
        }],
    }, sort_keys=True, separators=(",", ":")).encode()
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        def add(name, data=None, mode=0o644):
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        add("blobs")
        add("blobs/sha256")
        for blob in sorted((compressed, image_config, manifest), key=digest):
            add("blobs/sha256/" + digest(blob)[len("sha256:"):], blob)
        add("index.json", index)
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    os.replace(tmp, out)
    return digest(manifest), len(compressed)


def source_date_epoch():
    if "SOURCE_DATE_EPOCH" in os.environ:
        return int(os.environ["SOURCE_DATE_EPOCH"])
    result = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"],
                            capture_output=True, text=True)
    return int(result.stdout.strip()) if result.returncode == 0 and result.stdout.strip() else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", required=True, type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "target/image")
    parser.add_argument("--dockerfile", type=Path, default=REPO / "Dockerfile")
    parser.add_argument("--name", default="localhost/netclaim")
    options = parser.parse_args()
    if not options.binary.is_file():
        fail(f"{options.binary} is not a file (build it first: make image)")
    version = tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["version"]
    packages, config = parse_dockerfile(options.dockerfile, {"VERSION": version})
    out = options.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    debs = download(packages, out / "apt", out / "debs")
    rootfs = out / "rootfs"
    subprocess.run(["bash", str(REPO / "scripts/image/rootfs.sh"), str(options.binary),
                    str(out / "debs"), str(rootfs)], check=True)
    epoch = source_date_epoch()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    layer = layer_tar(rootfs, epoch)
    archive = out / f"netclaim-{version}.oci.tar"
    ref = f"{options.name}:{version}"
    manifest_digest, compressed = write_archive(archive, ref, version, config, layer, created)
    (out / "packages.txt").write_text("".join(f"{deb}\n" for deb in debs))
    mib = 1024 * 1024
    print(f"image: {archive.relative_to(REPO) if archive.is_relative_to(REPO) else archive}")
    print(f"  name      {ref}")
    print(f"  manifest  {manifest_digest}")
    print(f"  layer     {len(layer) / mib:.1f} MiB unpacked, {compressed / mib:.1f} MiB gzip")
    print(f"  archive   {archive.stat().st_size / mib:.1f} MiB")
    print(f"  packages  {' '.join(debs)}")


if __name__ == "__main__":
    main()
