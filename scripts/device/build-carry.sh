#!/usr/bin/env bash
# Builds the CUDA-enabled binaries on this (GPU-less) dev machine and packs them, with the
# non-GStreamer libraries they need, into .carry/dev.tar.xz for the lent GPU machine
# (the GStreamer runtime travels separately as .gstrt, see ../shared/device/README.md).
# On the GPU machine: tar xJf .carry/dev.tar.xz -C /tmp && . /tmp/dev/env.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build-dev}
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATENT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DLATENT_TOOL_OPENCV=OFF -DLATENT_BUILD_PLUGIN=ON -DLATENT_BUILD_TESTS=ON >/dev/null
targets=(latent-tool gstlatent ${LATENT_DEVICE_TESTS:-test_cuda_ops test_cuda_fp8 test_cuda_dit_ops test_cuda_sdpa test_cuda_dit_model test_cuda_models test_cuda_graphs test_gst_cuda test_gst_dit_cuda bench_attention bench_conv test_cuda_taehv test_cuda_video_vae test_gst_video_cuda latent-bench-video})
ninja -C $B -j"${J:-2}" "${targets[@]}"
rm -rf .carry/dev && mkdir -p .carry/dev/bin .carry/dev/lib .carry/dev/plugin
cp $B/tools/latent-tool .carry/dev/bin/
[ -f $B/tools/latent-bench-video ] && cp $B/tools/latent-bench-video .carry/dev/bin/
cp $B/plugin/libgstlatent.so .carry/dev/plugin/
for t in "${targets[@]}"; do
  [ -f $B/tests/$t ] && cp $B/tests/$t .carry/dev/bin/
done
strip --strip-debug .carry/dev/bin/* .carry/dev/plugin/*.so
for l in libdnnl.so.2 libOpenCL.so.1 libgomp.so.1; do
  cp -L "$(ldconfig -p | awk -v l=$l '$1==l {print $NF; exit}')" .carry/dev/lib/$l
done
cat > .carry/dev/env.sh <<'ENV'
D=/tmp/dev; export PATH=$D/bin:$PATH LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} GST_PLUGIN_PATH_1_0=$D/plugin
ENV
# One big dictionary: the binaries share most of their bytes (the engine's kernels).
tar cf - -C .carry dev | xz -T2 --lzma2=preset=6,dict=192MiB > .carry/dev.tar.xz
ls -la .carry/dev.tar.xz
