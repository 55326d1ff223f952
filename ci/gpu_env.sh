# Sourced by ci/gpu.sh, ci/gpu_backward.sh and ci/gpu_context_parallel.sh on the device machine
# (from the repository root): the binaries' folder, the log folder and the libraries they load.
BIN=${ORTHROS_GPU_BIN:-build-cuda-carry}
OUTDIR=${OUT:-gpu-out}
mkdir -p "$OUTDIR"
# ci/gpu_stage.sh also packs the folder as one xz archive (build-xz/carry.tar.xz, about a fifth of
# its size): carry build-xz instead of the folder when the 64 MiB limit bites; it is unpacked here.
if [ ! -d "$BIN" ] && [ -f build-xz/carry.tar.xz ]; then
  mkdir -p "$BIN" && tar -xJf build-xz/carry.tar.xz -C "$BIN"
fi
export LD_LIBRARY_PATH="$PWD/$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# libcublas.so.13 (linked shared by the layer, cuda/src/layer/layer.cu): the device image's CUDA toolkit.
CUBLAS_SO=$(ldconfig -p | grep -o '/[^ ]*libcublas\.so\.13$' | head -1)
[ -z "$CUBLAS_SO" ] && CUBLAS_SO=$(find /usr/local/cuda*/ /usr/local/lib /opt -name libcublas.so.13 2>/dev/null | head -1)
[ -n "$CUBLAS_SO" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$CUBLAS_SO")"
# libnccl.so.2 (context parallelism): the image's nvidia-nccl wheel (PyTorch's).
NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
[ -n "$NCCL_LIB" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$NCCL_LIB"
export PYTHONUNBUFFERED=1
