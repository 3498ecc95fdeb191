# One image for the API, the worker, beat, Flower and the migration step (docker-compose.yml).
FROM python:3.11-slim

# uv installs the versions uv.lock pins (the ones CI tested; `make lock`) into /opt/offpath,
# with the interpreter of this image (never a downloaded one), compiled, no cache kept
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    UV_PROJECT_ENVIRONMENT=/opt/offpath UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1 \
    UV_NO_CACHE=1 UV_LINK_MODE=copy \
    PATH=/opt/offpath/bin:$PATH
# the Makefile's UV_VERSION
RUN pip install --no-cache-dir uv==0.13.9

# the source is installed from /src (one package, `offpath`); the processes run in /app.
# The locked dependencies first (a layer that survives changes to the code), then offpath
# itself, as a wheel (not editable: /src is not needed at run time)
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --locked --no-install-project --python python3
COPY offpath ./offpath
COPY api ./api
COPY worker ./worker
COPY examples ./examples
RUN uv sync --locked --no-editable --python python3 && useradd --create-home offpath \
    && mkdir -p /app/data && chown offpath /app/data
WORKDIR /app
USER offpath

EXPOSE 8000 5555
CMD ["offpath", "api", "--host", "0.0.0.0", "--port", "8000"]
