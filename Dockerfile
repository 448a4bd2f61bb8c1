# ratelimitd on Debian bookworm: a build stage with the -dev packages, and a
# runtime stage with only the shared libraries, running as a non-root user.
#
#   docker build -t ratelimitd .
#   docker run -p 8080:8080 -v $PWD/conf/ratelimitd.yaml:/etc/ratelimitd/ratelimitd.yaml:ro ratelimitd

FROM debian:bookworm-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      gcc make autoconf automake pkg-config libc6-dev \
      libmicrohttpd-dev libhiredis-dev libjansson-dev libyaml-dev \
      libnghttp2-dev libprotobuf-c-dev protobuf-c-compiler libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY configure.ac config.mk.in Makefile ./
COPY src/ src/
COPY lua/ lua/
COPY proto/ proto/
RUN make all

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libmicrohttpd12 libhiredis0.14 libjansson4 libyaml-0-2 libnghttp2-14 \
      libprotobuf-c1 libssl3 ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --no-create-home --uid 10001 ratelimitd
COPY --from=build /src/build/ratelimitd /usr/local/sbin/ratelimitd
COPY conf/ratelimitd.yaml /etc/ratelimitd/ratelimitd.yaml
# Inside a container the daemon must listen on every interface (and so
# must grpc_listen, when the config turns gRPC on).
ENV RATELIMITD_LISTEN=0.0.0.0:8080
USER 10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["/usr/local/sbin/ratelimitd"]
CMD ["-c", "/etc/ratelimitd/ratelimitd.yaml"]
