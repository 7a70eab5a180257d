# The stream_eval image: `stream-eval worker` (and every other sub-command).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY stream_eval ./stream_eval
RUN pip install --no-cache-dir .
EXPOSE 9464
ENTRYPOINT ["stream-eval"]
CMD ["worker", "--broker", "kafka://kafka:19092", "--metrics-port", "9464"]
