# The stream_eval image: `stream-eval worker` (and every other Kafka sub-command).
# Production only: no development broker (the `dev` extra), and it runs as an unprivileged user.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stream_eval ./stream_eval
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin stream-eval
USER 10001
EXPOSE 9464
# /healthz (liveness) and /readyz (readiness: partitions assigned and caught up) are served next to /metrics
ENTRYPOINT ["stream-eval"]
CMD ["worker", "--broker", "kafka://kafka:19092", "--metrics-port", "9464"]
