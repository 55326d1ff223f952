# Sourced from the repository root by the device jobs that import the Python package `orthros`
# (ci/gpu_torch.sh, ci/gpu_backward.sh, ci/gpu_ports_hf.sh) or install carried wheels (ci/gpu.sh,
# ci/gpu_backward.sh, ci/gpu_ports.sh).
# orthros_python_package CARRY: assembles the package from the working tree's pure-Python files
# (verify/python/orthros) and CARRY's compiled modules (ci/gpu_stage_python.sh) in a new temporary
# folder and prints that folder, the entry to put on PYTHONPATH. The caller removes it.
orthros_python_package() {
  local pkg
  pkg=$(mktemp -d) && mkdir -p "$pkg/orthros" && cp -r verify/python/orthros/. "$pkg/orthros/" \
    && cp "$1"/orthros/*.so "$pkg/orthros/" && echo "$pkg"
}

# orthros_carried_wheels PY GLOB: when .whl/ holds a wheel matching GLOB (the peers' wheels the
# device image lacks, carried with the call), installs every wheel of .whl/ with PY into /tmp/site
# and puts it first on PYTHONPATH (exported). Without such a wheel, does nothing.
orthros_carried_wheels() {
  if ls .whl/$2 >/dev/null 2>&1; then
    "$1" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
}
