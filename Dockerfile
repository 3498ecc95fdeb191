# One image for the API, the worker, beat, Flower and the migration step (docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1

# the source is installed from /src (one package, `offpath`); the processes run in /app
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY offpath ./offpath
COPY api ./api
COPY worker ./worker
COPY examples ./examples
# the versions CI tested (constraints.txt, `make lock`)
RUN pip install -c constraints.txt . && useradd --create-home offpath \
    && mkdir -p /app/data && chown offpath /app/data
WORKDIR /app
USER offpath

EXPOSE 8000 5555
CMD ["offpath", "api", "--host", "0.0.0.0", "--port", "8000"]
