# The operator's linux/amd64 image for users with Docker: a static binary on scratch, non-root,
# no shell. `make image` builds the same image, and its linux/arm64 twin in one index, without a
# container engine (scripts/build-image.sh).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target x86_64-unknown-linux-gnu --bin homelab-autoscaler \
 && install -D -m 0755 target/x86_64-unknown-linux-gnu/release/homelab-autoscaler /out/homelab-autoscaler \
 && install -d -m 1777 /out/tmp

FROM scratch
ARG VERSION=0.2.0
LABEL org.opencontainers.image.title="homelab-autoscaler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/homecluster-dev/homelab-autoscaler" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/ /
USER 65532:65532
ENTRYPOINT ["/homelab-autoscaler"]
CMD ["run"]
