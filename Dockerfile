# The netclaim image: the node daemon and the controller (one binary, `netclaim node` and
# `netclaim controller`), on nothing but the shared libraries the binary links.
#
#   docker build -t registry.example.com/netclaim:0.1.0 --build-arg VERSION=0.1.0 .
#
# Without Docker, `make image` builds the `runtime` stage from the same inputs (the binary
# built with the builder's cargo flags, the Debian bookworm packages of RUNTIME_PACKAGES cut
# down by scripts/image/rootfs.sh, and the config below) into an OCI image-layout archive,
# target/image/netclaim-<version>.oci.tar (docs/decisions/0015-deploy.md).
# tests/containerd/image.rs checks that archive against this file.

ARG RUST_VERSION=1.95
# The Debian packages that ship what `ldd netclaim` lists: libc6 (libc.so.6, libm.so.6, the
# dynamic loader), libgcc-s1 (libgcc_s.so.1), and gcc-12-base for libgcc-s1's copyright file
# (its doc directory links there). rootfs.sh fails naming a library none of them ship.
ARG RUNTIME_PACKAGES="libc6 libgcc-s1 gcc-12-base"

# --- builder: the release binary. clang and libbpf's headers compile bpf/ (build.rs). ---
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends clang libbpf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# --no-default-features: the image carries no `netclaim dev` (in-memory cluster, dev kubelet).
RUN cargo build --release --locked --no-default-features --bin netclaim \
 && cp target/release/netclaim /netclaim

# --- runtime-files: the runtime packages, cut down to what the binary loads. ---
FROM docker.io/library/debian:bookworm-slim AS runtime-files
ARG RUNTIME_PACKAGES
COPY --from=builder /netclaim /netclaim
COPY scripts/image/rootfs.sh /rootfs.sh
RUN apt-get update \
 && mkdir /debs && cd /debs && apt-get download ${RUNTIME_PACKAGES} \
 && bash /rootfs.sh /netclaim /debs /rootfs

# --- runtime: no shell, no package manager, nothing but the binary and its libraries. ---
FROM scratch AS runtime
ARG VERSION=dev
COPY --from=runtime-files /rootfs/ /
# Root because netlink and network namespaces need it; the DaemonSet drops every
# capability but the ones it lists (deploy/base/node-daemonset.yaml).
USER 0:0
ENV PATH=/usr/bin
# 9178: the node daemon's /metrics, /healthz, /readyz; 9179: the controller's.
EXPOSE 9178/tcp 9179/tcp
LABEL org.opencontainers.image.title="netclaim" \
      org.opencontainers.image.description="Kubernetes networking DRA driver: pod network interfaces without CNI" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENTRYPOINT ["/usr/bin/netclaim"]
