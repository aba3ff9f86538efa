# syntax=docker/dockerfile:1
# Multi-stage build of the agentq binary. The runtime image is distroless (no shell,
# no package manager), runs as the unprivileged "nonroot" user (uid 65532), and holds
# one static binary: the migrations and the default plan catalogue are embedded in it.

FROM golang:1.26 AS build
WORKDIR /src
# Dependencies first, so the module download is cached across source changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/agentq ./cmd/agentq

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/agentq /usr/local/bin/agentq
USER nonroot:nonroot
# Listen on every interface inside the container (the binary's default is 127.0.0.1).
ENV AGENTQ_HTTP_ADDR=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/agentq"]
CMD ["serve"]
