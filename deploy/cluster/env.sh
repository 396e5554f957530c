# Sourced by every process of a cluster build (webserver, daemon, run submitters, Celery workers), so they
# all load the same code location with the same engine and the same data roots. Edit the hosts; keep
# the data roots on storage every machine mounts at the same path.
# the repository's venv first: `dagster-celery worker start` execs `celery` by name
export PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv/bin:$PATH"
export SYNTHKD_EXECUTOR=celery
export SYNTHKD_CELERY_BROKER="${SYNTHKD_CELERY_BROKER:-redis://127.0.0.1:6379/0}"
export SYNTHKD_CELERY_BACKEND="${SYNTHKD_CELERY_BACKEND:-redis://127.0.0.1:6379/1}"
export SYNTHKD_POSTGRES_URL="${SYNTHKD_POSTGRES_URL:-postgresql+psycopg2://postgres@127.0.0.1:5432/dagster}"
export SYNTHKD_MAX_CONCURRENT_RUNS="${SYNTHKD_MAX_CONCURRENT_RUNS:-8}"
export SYNTHKD_RAW_DIR="${SYNTHKD_RAW_DIR:-/mnt/synth/raw}"
export SYNTHKD_DATA_DIR="${SYNTHKD_DATA_DIR:-/mnt/synth/data}"
export DAGSTER_HOME="${DAGSTER_HOME:-/mnt/synth/dagster_home}"
