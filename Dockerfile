# The stream_eval image: `stream-eval worker` (and every other Kafka sub-command).
# Production only: no development broker (the `dev` extra), and it runs as an unprivileged user.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stream_eval ./stream_eval
# numba's cache of the compiled loops: a directory the user owns (the package's own is root's), filled at build time
# so that a worker starts without compiling
ENV NUMBA_CACHE_DIR=/app/numba-cache
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin stream-eval \
    && mkdir -p /app/numba-cache && chown 10001 /app/numba-cache
USER 10001
RUN python -c "from stream_eval.config import Config; from stream_eval.stream.worker import warm_up; warm_up(Config())"
EXPOSE 9464
# /healthz (liveness) and /readyz (readiness: partitions assigned and caught up) are served next to /metrics
ENTRYPOINT ["stream-eval"]
CMD ["worker", "--broker", "kafka://kafka:19092", "--metrics-port", "9464"]
