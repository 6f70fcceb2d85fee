# Sourced by the lent-GPU scripts (device_session.sh, experiments/device_probe_*.sh): what each of them needs on the bare,
# offline machine, written once. Reads the ignored .gpu/ folder the call carries (docs/developing.md).

device_env() {  # what privdistill needs in the environment there (a sourcing script's exports, also after a
  # subprocess such as device_session.sh has installed everything, since its exports do not reach the caller)
  export PYTHONPATH=/tmp/site PRIVDISTILL_SOURCES=$PWD/.gpu/data PYTHONUNBUFFERED=1
  export PRIVDISTILL_GIT_COMMIT=$(cat .gpu/commit 2>/dev/null)
  # The stage cache lives in the checkout's ignored runs/, which a warm machine keeps between calls (a DGD paper
  # cell's teachers resume there from their last finished chunk); .gpu/ would be replaced by the next carry.
  export PRIVDISTILL_CACHE=${PRIVDISTILL_CACHE:-$PWD/runs/stage-cache}
}

device_setup() {  # install the carried wheels and this checkout, then device_env
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || return 1
  device_env
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile . || return 1
}

device_probe() {  # device_probe DIR NAME ARGS...: one privdistill run on CUDA into DIR/NAME, if at least
  # PROBE_MIN_LEFT seconds (default 30) are left of DEADLINE seconds from T0; then DIR is packed into
  # $OUT/<DIR's name>.tgz, so that what finished comes back even if the call is cut short
  local dir=$1 name=$2 left; shift 2; left=$(( DEADLINE - ($(date +%s) - T0) ))
  if [ $left -lt "${PROBE_MIN_LEFT:-30}" ]; then echo "=== no time left for $name"; return; fi
  echo "=== $name (left ${left}s) $(date +%T)"; mkdir -p "$dir"
  timeout -k 5 $left privdistill "$@" --device cuda --no-progress --run-dir "$dir/$name" > "$dir/$name.log" 2>&1
  echo "rc $? after $(( $(date +%s) - T0 ))s"; grep -E "test_accuracy|epsilon_|privacy:" "$dir/$name.log" | head -4
  tar czf "$OUT/$(basename "$dir").tgz" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.npy' \
    --exclude=synthetic "$dir"
}
