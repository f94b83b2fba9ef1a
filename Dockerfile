FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY runtime ./runtime
COPY schema ./schema
COPY worker ./worker
RUN pip install --no-cache-dir .
ENTRYPOINT ["aidawork"]
