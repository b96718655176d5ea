# syntax=docker/dockerfile:1
#
# The Switchboard gateway as a static, non-root image:
#
#   docker build -t switchboard .
#   docker run --rm -p 8080:8080 -p 9464:9464 -v "$PWD/my-config:/etc/switchboard:ro" switchboard
#
# The image holds no config: mount a directory with gateway.yaml at
# /etc/switchboard (a directory, so edits and Kubernetes ConfigMap updates
# reach the gateway's file watch). In a container, server.listen and
# admin.listen must bind all interfaces (":8080", ":9464"); the built-in
# defaults are loopback. deploy/kubernetes runs this image.
#
# Version: `switchboard --version` reads the commit from the Go build's VCS
# stamp (cmd/gateway/version.go; there is no -X variable to set). It needs
# the repository's .git in the build context, which .dockerignore keeps; a
# context without it (a source tarball) builds fine and reports "devel". Only
# ignored files are excluded from the context, so a clean checkout is not
# reported "-dirty".

ARG GO_VERSION=1.26

# Build on the builder's own platform and cross-compile (no emulation for
# docker buildx --platform linux/amd64,linux/arm64).
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first, in their own layer and cache, so a source change does not
# download them again.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=bind,source=go.mod,target=go.mod \
    --mount=type=bind,source=go.sum,target=go.sum \
    go mod download
COPY . .
ARG TARGETOS TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /out/switchboard ./cmd/gateway

# Static binary, no shell, CA certificates and tzdata included; runs as
# nonroot (uid 65532; Kubernetes needs the number in runAsUser to verify
# runAsNonRoot, see deploy/kubernetes/base/deployment.yaml).
FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="switchboard" \
      org.opencontainers.image.description="OpenAI-compatible gateway for vLLM-style inference engines" \
      org.opencontainers.image.source="https://github.com/switchboard-gw/switchboard"
COPY --from=build /out/switchboard /usr/local/bin/switchboard
USER nonroot
# 8080: server.listen (OpenAI API, /health, /ready); 9464: admin.listen (/metrics, /admin).
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/switchboard", "--config", "/etc/switchboard/gateway.yaml"]
