# rocketgate: a durable message broker (NameServer + broker + MQTT/HTTP/WebSocket/
# native doors in one binary). docs/operations.md, "Packaging".
#
#   docker build -t rocketgate .
#   docker run -p 1883:1883 -p 8080:8080 -v rg-data:/data \
#     -e ROCKETGATE_AUTH__ALLOW_ANONYMOUS=true rocketgate        # isolated testing only
#
# Every door listens on 0.0.0.0 in the container. With authentication off the node
# refuses to start on such addresses (docs/security.md) unless told to allow
# anonymous access: enable auth (ROCKETGATE_AUTH__ENABLED=true and a user store in
# /data/users.toml, made with `rocketgate user add … --data-dir /data`) or set
# ROCKETGATE_AUTH__ALLOW_ANONYMOUS=true deliberately.

# ---- build ----
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
# --locked: the versions in Cargo.lock; --no-default-features: the product build
# without the load generators (`rocketgate bench`).
RUN cargo build --release --locked --no-default-features --bin rocketgate \
    && cp target/release/rocketgate /usr/local/bin/rocketgate

# ---- run ----
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin rocketgate \
    && mkdir -p /data && chown rocketgate:rocketgate /data
COPY --from=builder /usr/local/bin/rocketgate /usr/local/bin/rocketgate
USER rocketgate
WORKDIR /data
VOLUME /data
ENV ROCKETGATE_DATA_DIR=/data \
    ROCKETGATE_LISTEN__NAMESRV=0.0.0.0:9876 \
    ROCKETGATE_LISTEN__NATIVE=0.0.0.0:10911 \
    ROCKETGATE_LISTEN__MQTT=0.0.0.0:1883 \
    ROCKETGATE_LISTEN__HTTP=0.0.0.0:8080 \
    ROCKETGATE_LISTEN__WS=0.0.0.0:8083 \
    ROCKETGATE_LISTEN__HA=0.0.0.0:10912
# NameServer, native, MQTT, HTTP, WebSocket, replication
EXPOSE 9876 10911 1883 8080 8083 10912
# Ready = store recovered, NameServer registered, every door listening
# (`GET /readyz`; open without credentials also with auth on). Exit 0 ready,
# 1 not ready, 3 unreachable.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["rocketgate", "admin", "--server", "http://127.0.0.1:8080", "health"]
# SIGTERM stops cleanly (offsets saved, store synced); give it time.
STOPSIGNAL SIGTERM
ENTRYPOINT ["rocketgate"]
CMD ["standalone"]
