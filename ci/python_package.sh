# Sourced from the repository root by the device jobs that import the Python package `orthros`
# (ci/gpu_torch.sh, ci/gpu_backward.sh, ci/gpu_ports_hf.sh).
# orthros_python_package CARRY: assembles the package from the working tree's pure-Python files
# (verify/python/orthros) and CARRY's compiled modules (ci/gpu_stage_python.sh) in a new temporary
# folder and prints that folder, the entry to put on PYTHONPATH. The caller removes it.
orthros_python_package() {
  local pkg
  pkg=$(mktemp -d) && mkdir -p "$pkg/orthros" && cp -r verify/python/orthros/. "$pkg/orthros/" \
    && cp "$1"/orthros/*.so "$pkg/orthros/" && echo "$pkg"
}
