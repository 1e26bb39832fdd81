# The two entry points a newcomer needs. Build caches live outside the clone:
# cargo's target dir, Go's module/build caches and the built control-plane binaries all sit
# under ~/.cache, so a warm run spends its time on tests.
CACHE ?= $(HOME)/.cache/homelab-autoscaler
export CARGO_TARGET_DIR ?= $(CACHE)/target
export HOMELAB_TEST_CACHE ?= $(CACHE)

.PHONY: test demo bench manifests lint

## test: unit, table and integration tests against a real control plane built from Go modules.
test:
	tests/harness/build-binaries.sh e2e
	cargo test --workspace --all-targets --locked

## demo: a local pool of simulated machines scaling up and down, under the real
## cluster-autoscaler and then the built-in scaler. DRIVER=cluster-autoscaler|builtin picks one;
## KEEP=1 leaves the last cluster running and prints its KUBECONFIG.
demo:
	DRIVER=$(DRIVER) KEEP=$(KEEP) tests/harness/demo.sh

## bench: the pure model with criterion, then the operator against a real control plane
## (footprint, provider latency, scale-up overhead, admission); results in docs/performance.md.
## SECTIONS="pools webhook" runs some of the operator's; BENCH_* knobs are in benches/operator/main.rs.
bench:
	tests/harness/build-binaries.sh cluster
	cargo bench --locked --bench model
	cargo bench --locked --bench operator -- $(SECTIONS)

## manifests: regenerate crds/ and webhooks/ from the code.
manifests:
	cargo run --locked -q -- manifests write

## lint: formatting and clippy, as CI runs them.
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
