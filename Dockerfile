# One image for the API, the worker, Flower and the migration step (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

COPY pyproject.toml README.md constraints.txt ./
COPY compaction ./compaction
COPY service ./service
COPY api ./api
COPY worker ./worker
COPY cli ./cli
COPY examples ./examples
# the versions CI tested (constraints.txt, `make lock`)
RUN pip install -c constraints.txt . && useradd --create-home offpath && mkdir -p /app/data && chown offpath /app/data
USER offpath

EXPOSE 8000 5555
CMD ["offpath", "api", "--host", "0.0.0.0", "--port", "8000"]
