# Parley in a container (README, "Running as a service"):
#   docker build -t parley .
#   docker run -d --name parley -v parley-data:/home/parley/.parley \
#     -e PARLEY_MODEL -e PARLEY_API_KEY -e PARLEY_API_BASE \
#     -e PARLEY_LOCAL_TOKEN -e PARLEY_WEBCHAT_TOKEN \
#     -p 127.0.0.1:8765:8765 -p 127.0.0.1:8766:8766 parley
# Inside the container the channels listen on 0.0.0.0, so both tokens are required (the
# gateway refuses to start without them, naming the key).
FROM python:3.11-slim

# bubblewrap: the exec tool's sandbox; util-linux: prlimit for its limits.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap util-linux \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY gateway ./gateway
COPY channels ./channels
COPY agent ./agent
COPY workspace ./workspace
COPY parley ./parley
RUN pip install --no-cache-dir -c constraints.txt . && rm -rf /src

RUN useradd --create-home --shell /usr/sbin/nologin parley
USER parley
WORKDIR /home/parley
ENV PARLEY_HOST=0.0.0.0 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    PYTHONUNBUFFERED=1
VOLUME /home/parley/.parley
EXPOSE 8765 8766

# The first start writes ~/.parley/config.yaml (the model from PARLEY_MODEL, PARLEY_API_KEY,
# PARLEY_API_BASE); later starts keep it, so edit it in the volume.
CMD ["sh", "-c", "parley onboard --non-interactive --skip-test && exec parley gateway"]
