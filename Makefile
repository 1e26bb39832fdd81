# The two entry points a newcomer needs. Build caches live outside the clone:
# cargo's target dir, Go's module/build caches and the built control-plane binaries all sit
# under ~/.cache, so a warm run spends its time on tests.
CACHE ?= $(HOME)/.cache/homelab-autoscaler
export CARGO_TARGET_DIR ?= $(CACHE)/target
export HOMELAB_TEST_CACHE ?= $(CACHE)
# KUBE_VERSION=1.34.4: the control plane, kubelet and kubectl of `make test`, `make demo` and
# `make bench` at another Kubernetes release than the pinned one (tests/harness/go/k8s), built
# beside the pinned binaries, never over them (docs/install.md has the supported window).
ifdef KUBE_VERSION
export HOMELAB_KUBE_VERSION := $(KUBE_VERSION)
endif

.PHONY: test test-fast demo bench manifests lint lint-format image reliability-long soak

## test: unit, table and integration tests against a real control plane built from Go modules,
## the power drivers against real protocol peers (installed by install-power-peers.sh), and the
## real-machine tier (network namespaces running a real kubelet and containerd; needs root).
## The arm64 build (D43) is tested too: the library's tests and the operator under qemu-user.
## The test executables of `cargo test --workspace --all-targets` run three at a time
## (run-tests.sh; HOMELAB_TEST_LANES changes that, `make test ONLY="webhooks controllers"` runs some).
## The programs the suites that run alone need (the `cluster` profile) are built beside the test
## build, the operator's image linked from its crates; the rest of the Go programs
## (the `all` profile) build beside the suites at nice 19, in the time they spend waiting on clocks.
## HOMELAB_TEST_CLIPPY=1 (.ci/run) makes the test build clippy's too: a lint warning fails it.
test:
	tests/harness/install-power-peers.sh
	scripts/install-cross-toolchain.sh
	HOMELAB_TEST_BUILD_FIRST=cluster $(if $(ONLY),,HOMELAB_TEST_IMAGE_FIRST=1 HOMELAB_TEST_BUILD_BESIDE=all) \
		tests/harness/run-tests.sh $(ONLY)

## test-fast: the library's unit and table tests and every suite that needs no control plane;
## nothing in Go is built or started (HOMELAB_TEST_NO_CONTROL_PLANE makes a suite that asks for
## one fail at once). The list is docs/testing.md's "fast" tier.
FAST_SUITES = dependency_rules docs_match_code fuzz_admission fuzz_parsing grpc_tls proto_conformance reliability_security
test-fast:
	HOMELAB_TEST_NO_CONTROL_PLANE=1 cargo test --locked --lib $(addprefix --test ,$(FAST_SUITES))

## demo: a local pool of simulated machines scaling up and down, under the real
## cluster-autoscaler and then the built-in scaler. DRIVER=cluster-autoscaler|builtin picks one;
## KEEP=1 leaves the last cluster running and prints its KUBECONFIG; MACHINES=real (root) plays
## it on real machines (a kubelet and containerd each, Wake-on-LAN on, SSH off), and then a
## machine that sleeps and wakes (DRIVER=sleep plays that part alone).
demo:
	DRIVER=$(DRIVER) KEEP=$(KEEP) MACHINES=$(MACHINES) tests/harness/demo.sh

## image: the operator's OCI image index (linux/amd64, linux/arm64) without a container engine:
## a static binary per platform packed with crane into an OCI layout tarball
## ($(CARGO_TARGET_DIR)/image/homelab-autoscaler.tar, or IMAGE_OUT). IMAGE and TAG name it;
## PLATFORMS=linux/amd64 builds one. The Dockerfile builds the amd64 image with Docker.
image:
	scripts/build-image.sh $(IMAGE_OUT)

## bench: the pure model with criterion, then the operator against a real control plane
## (footprint, provider latency, scale-up overhead, admission, and a real machine's cold boot
## against its resume from sleep, which needs root); results in docs/performance.md.
## SECTIONS="pools webhook" runs some of the operator's; BENCH_* knobs are in benches/operator/main.rs.
bench:
	tests/harness/build-binaries.sh cluster
	cargo bench --locked --bench model
	cargo bench --locked --bench operator -- $(SECTIONS)

## manifests: regenerate crds/ and webhooks/ from the code.
manifests:
	cargo run --locked -q -- manifests write

## lint: formatting, the workflows (actionlint, built by build-binaries.sh under its lock, and
## a check that every repository command they call exists) and clippy. Clippy keeps its own
## target dir, so that it never waits on the test build's lock. .ci/run runs `lint-format`
## beside `make test` and has the test build run clippy's lints (HOMELAB_TEST_CLIPPY=1), the same
## lints without a second build of every dependency.
lint: lint-format
	CARGO_TARGET_DIR=$(CACHE)/lint-target cargo clippy --workspace --all-targets --locked -- -D warnings

## lint-format: formatting and the workflows, `make lint` without clippy.
lint-format:
	cargo fmt --all -- --check
	tests/harness/lint-workflows.sh

## soak: the seeded fault run on real machines at length, under the built-in scaler
## (tests/real_machines_faults.rs) or, with DRIVER=cluster-autoscaler, under the real
## cluster-autoscaler (tests/real_machines_faults_autoscaler.rs). SEED (default: from the clock)
## and MINUTES (default 60). It prints each step, the machines then on and the live claims, and
## every invariant's count; a failing seed replays with the same SEED. Needs root.
MINUTES ?= 60
SOAK_SUITE = $(if $(filter cluster-autoscaler,$(DRIVER)),real_machines_faults_autoscaler,real_machines_faults)
soak:
	tests/harness/build-binaries.sh autoscaler
	HOMELAB_FAULT_SEED=$(or $(SEED),$(shell date +%s)) HOMELAB_FAULT_MINUTES=$(MINUTES) \
		cargo test --locked --test $(SOAK_SUITE) -- --nocapture a_seeded_fault_run

## reliability-long: the long runs of the crash-injection and fuzz suites (not in CI; the figures
## are in docs/reliability.md). RUNS and CASES override the sizes.
RUNS ?= 500
CASES ?= 120000
reliability-long:
	tests/harness/build-binaries.sh cluster
	HOMELAB_CRASH_RUNS=$(RUNS) cargo test --locked --test reliability_crash -- --nocapture
	HOMELAB_SIGKILL_RUNS=20 cargo test --locked --test reliability_sigkill -- --nocapture
	HOMELAB_FUZZ_CASES=$(CASES) cargo test --locked --test fuzz_parsing --test fuzz_admission
