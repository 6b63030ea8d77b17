# The entry points for people and CI. `.ci/run` calls `make lint` and `make test`.
CARGO ?= cargo

.PHONY: demo run setup build lint test bench vmtest image

# First command of the README: install what the demo needs (base tools, ping), build, run
# `netclaim dev --demo` (15 pods with a macvlan each on a veth it creates; cleans up after).
# The first release build is long (~14 min on 2 cores, issue 32), so that is said before it
# starts; cargo's own "Compiling …" lines (and its bar on a terminal) show it moving.
demo:
	@echo "make demo: installs base tools and ping, then builds netclaim (release) and runs"
	@echo "  'netclaim dev --demo'. The first build takes ~14 min on 2 cores (cargo shows its"
	@echo "  progress below); once built, seconds."
	bash scripts/setup/00-base.sh
	bash scripts/setup/20-podnet.sh
	$(CARGO) build --release --bin netclaim
	./target/release/netclaim dev --demo --listen 127.0.0.1:0

# Install what is needed, build, show this node's devices.
# Needs only the base tools (the test-only installs of `setup` are skipped).
run:
	bash scripts/setup/00-base.sh
	$(CARGO) build --release --bin netclaim
	./target/release/netclaim inventory

setup:
	./scripts/setup.sh

build:
	$(CARGO) build --workspace --all-targets

lint:
	$(CARGO) fmt --check
	python3 scripts/lint/file-size.py
	$(CARGO) clippy --workspace --all-targets --features netclaim/failpoints -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

# The whole suite: doc examples (nextest does not run doctests), then unit, in-process, root
# integration (throwaway netns), e2e.
# Must run as root; it ends with nextest's summary line.
# Root-tier tests (and those needing kubectl or containerd) are #[ignore]d: a plain
# `cargo nextest run` reports them as skipped. As root, with the setup done, they all run.
RUN_IGNORED := $(if $(filter 0,$(shell id -u)),--run-ignored all,)

# After nextest, never beside it, the VM tests run on kernels 6.1 and 6.12
# (vmtests/after-nextest.sh, decision 0012); nextest's summary line is printed again last.
# The scale test runs the release daemon the image ships (`image` built it: no default
# features; a `dev` build maps ~6 MiB more text, which its memory bound counts). Every
# benchmark runs once in its smoke mode (`cargo test --benches`), so none can rot; under CI
# (CI set) a bench that cannot run (no root, no CNI plugins) fails instead of skipping.
# `image` first: tests/containerd/image.rs checks its archive and runs it on containerd.
test: setup image
	$(CARGO) test --workspace --doc --quiet
	$(CARGO) test --benches --features netclaim/failpoints
	$(CARGO) build --release --locked --no-default-features --bin netclaim
	NETCLAIM_RELEASE_BIN=$(CURDIR)/target/release/netclaim CARGO=$(CARGO) VM_GUESTS="$(VM_GUESTS)" \
	  VM_CARGO_ARGS="--features netclaim/failpoints" bash vmtests/after-nextest.sh \
	  $(CARGO) nextest run --workspace --features netclaim/failpoints --no-fail-fast $(RUN_IGNORED)

bench:
	$(CARGO) bench

# The Dockerfile's runtime stage without Docker or a registry: the release binary with the
# Dockerfile builder's cargo flags, the Debian packages it names cut down to what ldd lists,
# written as target/image/netclaim-<version>.oci.tar (`ctr images import` takes it).
image:
	$(CARGO) build --release --locked --no-default-features --bin netclaim
	python3 scripts/image/build.py --binary target/release/netclaim

# VM tests (decision 0012, vmtests/README.md): install QEMU 10, virtme-ng and the Debian
# kernels into /opt/netclaim-vm (idempotent), build the VM test binary on the host, boot the
# guests of VM_KERNEL (6.1, 6.12 or both, space-separated) under TCG with two igb NICs and run
# the suites inside as root (vmtests/guests.sh). `make test` runs them on both kernels after
# nextest. VM_GUESTS: one word per guest, each a comma-separated list of suites of the `vm`
# test binary (modules of tests/vm/) run in that order, each in a process of its own; a guest
# with vm_reboot boots twice. Longest first: vmtests/guests.sh starts them in this order, two
# at once (the per-suite times are in vmtests/README.md).
comma := ,
VM_KERNEL ?= 6.1
VM_GUESTS := vm_sriov,vm_reboot vm_kernel,vm_ipvlan,vm_stats vm_daemon,vm_vlan \
  vm_attach_bench,vm_pf_move,vm_ethtool vm_rdma,vm_rdma_pod,vm_routing,vm_bandwidth vm_vfio vm_vfio_acs

vmtest:
	bash vmtests/install.sh
	mkdir -p target/vmtests
	CARGO=$(CARGO) bash vmtests/build.sh $(subst $(comma), ,$(VM_GUESTS)) > target/vmtests/binaries
	VM_GUESTS="$(VM_GUESTS)" bash vmtests/guests.sh $(VM_KERNEL); status=$$?; \
	  cat target/vmtests/summary; exit $$status
