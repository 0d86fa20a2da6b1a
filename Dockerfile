# syntax=docker/dockerfile:1
# Builds the operator binary and ships it on distroless: no shell, no package manager, uid 65532.

# Base images are pinned by digest, so a rebuild pulls the bytes that were reviewed, not whatever
# a moving tag names that day. The digests are the published manifest lists of these tags (read
# where they are pinned in other public builds; no registry is reachable from where this file is
# maintained): check one with `docker buildx imagetools inspect <image>:<tag>`, and move them
# forward with Dependabot or Renovate (both update `FROM image:tag@sha256:...` lines).
FROM rust:1-bookworm@sha256:93ce27a88655056a51dbdd8f5f2d7ddc071c7b0070fb288a37b5a285fc83971e AS builder
# aws-lc-sys (AWS SDK TLS) may fall back to CMake and needs a C toolchain; ring needs cc only.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake clang \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY . .
# Cache mounts keep the registry and build artefacts across builds; the binary is copied out of
# the cached target dir because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/build/target \
    cargo build --release --locked -p questdb-operator --bin questdb-operator \
 && install -D -m 0755 target/release/questdb-operator /out/questdb-operator

FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=builder /out/questdb-operator /questdb-operator
# Numeric user so `runAsNonRoot` can be verified by the kubelet without reading /etc/passwd.
USER 65532:65532
# Metrics and health probes (see deploy/operator/deployment.yaml). The binary writes nothing to disk,
# so it runs with a read-only root filesystem.
EXPOSE 8080 8081
ENTRYPOINT ["/questdb-operator"]
CMD ["run"]
