#!/usr/bin/env bash
# Runs on the lent GPU machine (see scripts/device/build-carry.sh), from the repository root,
# with .carry (dev.tar.xz, ref/taesd.py), .gstrt and .whl carried. Writes logs under $OUT.
#   STEPS="tests gst fixtures bench" (default: all)
set -uo pipefail
FINAL=${OUT:-/tmp/out}
OUT=/tmp/res; mkdir -p $OUT   # everything comes back as one archive (the tool returns <= 8 files)
trap 'tar czf $FINAL/results.tgz -C /tmp/res .' EXIT
trap 'exit 143' TERM INT
STEPS=${STEPS:-tests gst fixtures bench pipelines}
tar xJf .carry/dev.tar.xz -C /tmp && . /tmp/dev/env.sh
NV=$(python3 -c "import nvidia,glob,os;print(':'.join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d+'/**/lib*.so*',recursive=True)})))" 2>/dev/null)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH${NV:+:$NV}
export LATENT_FIXTURES=$PWD/tests/fixtures LATENT_DEFAULT_MODEL=$PWD/models/default
# The GStreamer runtime (../shared/device/gst-runtime.sh) for gst-launch and the gst tests.
G=$PWD/.gstrt; export PATH=$G/bin:$PATH LD_LIBRARY_PATH=$G/lib:$LD_LIBRARY_PATH GST_PLUGIN_SYSTEM_PATH_1_0=$G/lib/gstreamer-1.0 GST_PLUGIN_SCANNER_1_0=$G/libexec/gst-plugin-scanner GST_REGISTRY_1_0=/tmp/gstrt-registry.bin GST_CUDA_NVRTC_LIBNAME=$G/lib/libgstrt-nvrtc-shim.so
nvidia-smi -L
ldd /tmp/dev/bin/latent-tool | grep "not found"
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }

if has tests; then
  for t in test_cuda_ops test_cuda_models test_cuda_graphs test_cuda_dit_ops test_cuda_dit_model test_gst_cuda test_autoencoder_kl test_tiny test_qwen_image_vae; do
    [ -x /tmp/dev/bin/$t ] || continue
    timeout 300 /tmp/dev/bin/$t --gtest_color=no > $OUT/$t.log 2>&1
    echo "$t: exit $? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' $OUT/$t.log | tr '\n' ' ')"
  done
  grep -E "bf16 rel L2" $OUT/test_cuda_models.log | head -20
  grep -hE "^\[  FAILED  \] [A-Za-z]" $OUT/test_*.log 2>/dev/null | cut -c1-160 | sort -u | head -30
fi

if has gst; then
  (
    gst-inspect-1.0 latent 2>&1 | head -12
    for m in models/default tests/fixtures/qwen_image_vae_tiny; do
      for size in 1024x1024 1920x1080; do
        w=${size%x*}; h=${size#*x}
        /usr/bin/time -f "%e s wall" gst-launch-1.0 -q videotestsrc num-buffers=60 ! video/x-raw,format=RGB,width=$w,height=$h ! \
          vaeencode model=$m device=cuda ! vaedecode model=$m device=cuda ! fakesink sync=false 2>&1 | tail -3
        echo "^ gst cuda $m $size 60 frames"
      done
    done ) > $OUT/gst.log 2>&1
  cat $OUT/gst.log | tail -30
fi

if has fixtures && [ -f .carry/ref/taesd.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  python3 scripts/make_fixtures.py --out /tmp/fx --device cuda --taesd-py .carry/ref/taesd.py > $OUT/fixtures.log 2>&1
  echo "fixtures: exit $?"; tail -3 $OUT/fixtures.log
  tar czf $OUT/fixtures.tgz -C /tmp/fx .
fi

if has bench; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
  python3 bench/bench_vae.py --tool /tmp/dev/bin/latent-tool --out $OUT/bench-vae.json --workdir /tmp/latent-bench \
    --models ${BENCH_MODELS:-qwen} --sizes ${BENCH_SIZES:-512x512,1024x1024,1280x720,1920x1088} \
    --compile ${BENCH_COMPILE:-static} --repeat 10 2>&1 | tee $OUT/bench-vae.log | tail -14
fi

if has pipelines; then
  (
    models=$PWD/models/default; [ -d /tmp/latent-bench/qwen ] && models=$models,/tmp/latent-bench/qwen
    python3 bench/bench_pipelines.py --models $models --out $OUT/bench-pipelines.json 2>&1 | tee $OUT/bench-pipelines.log | tail -12 )
fi

if has dit; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
  timeout ${DIT_TIMEOUT:-330} python3 bench/bench_dit.py --tool /tmp/dev/bin/latent-tool --out $OUT/bench-dit.json \
    --layers ${DIT_LAYERS:-60} --compile ${DIT_COMPILE:-static} 2>&1 | tee $OUT/bench-dit.log | tail -8
fi
