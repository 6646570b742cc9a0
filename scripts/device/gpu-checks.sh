#!/usr/bin/env bash
# Runs on the lent GPU machine (see scripts/device/build-carry.sh), from the repository root,
# with .carry (dev.tar.xz, ref/taesd.py), .gstrt and .whl carried. Everything written lands in
# $OUT/results.tgz (one archive: the tool returns <= 8 files), also after a timeout; a compact
# summary is printed last.
#   STEPS="tests gst fixtures bench pipelines" (the default); each step has its own timeout.
# Steps and rough durations on an H100 (pick several per 10-minute call; the sums are what fit):
#   tests         GPU unit/model tests                         ~2-3 min
#   gst           gst-launch smoke, default + tiny Qwen          <1 min
#   fixtures      scripts/make_fixtures.py on CUDA               ~1-2 min
#   bench         bench_vae.py for BENCH_MODELS (default qwen)   ~4 min
#   vae-qwen      bench_vae.py, Qwen-Image VAE, eager+compile+ours, 4 sizes    ~4 min (cap VAE_BUDGET)
#   vae-flux      same for the FLUX.1 VAE                                      ~4 min (cap VAE_BUDGET)
#   vae-taesd     same for the TAESD-size AutoencoderTiny                      ~2 min
#   vae-default   same for the built-in default model (models/default, its own weights)  ~2 min
#   pipelines     bench_pipelines.py: default + Qwen VAE, 1024^2 and 1080p, system/CUDA memory,
#                 prefetch-depth default/0, cuda-graphs true/false if the property exists  ~5 min
#   pinned        test_gst_cuda, then bench_pipelines.py's system-memory rows (default model, 1080p, the
#                 source on the elements' thread and behind a queue) with LATENT_PINNED_INPUT=0 and 1
#                 alternated, PINNED_REPEAT times (default 3): vaeencode's page-locked frames offered
#                 upstream, A/B  ~2 min
#   stageorder    test_gst_cuda (unless gsttests/pinned ran it), bench/pipeline_thread_times.py (the one-thread
#                 pipeline's frame split: LATENT_STAGE_ORDER=host|device x LATENT_FENCED_LATENTS, and a queued
#                 row), then bench_pipelines.py's system-memory rows A/B LATENT_STAGE_ORDER=host,device with the
#                 fences STAGE_FENCES (default 1; "0 1" both), STAGE_REPEAT times (default 2)  ~2-3 min
#   stream        latent-tool stream at 1080p (copy/compute/serial/overlapped), skipped if absent  ~1 min
#   pipes         the GPU pipelines/ scripts (cuda_memory, gpu_prefetch, latents_cuda_memory)  ~1 min
#   taehv         bench_taehv.py: TAEW2.1 720p vs taehv.py (.carry/ref/taehv.py)  ~3 min
#   gsttests      test_gst_cuda, test_gst_dit_cuda, test_gst_video_cuda (the elements' GPU tests)  ~1-2 min
#   pygi          builds PyGObject for the device's python3 (scripts/device/pygi-carry.sh, pygi-build.sh)  ~1 min
#   precompute    bench_precompute.py: the precompute job on 720p H.264 clips (PRE_ENGINES=local|ray,local,
#                 PRE_GPUS=1|1,2 for scaling; PRE_MODELS=wan21 for the Wan 2.1 VAE, or a list: wan21,$PWD/models/default; PRE_ARGS: more
#                 bench_precompute.py flags, e.g. --trace --skip-torch) vs the encoder alone and a PyTorch
#                 loop  ~3 min. The decoders alternated (session 29): PRE_MODELS=wan21 PRE_CLIPS=24
#                 PRE_ENGINES=local,local-cpudecode,local-decodebin,local,local-cpudecode
#                 PRE_ARGS="--pipelines 4 --skip-torch --skip-encoder"  ~3 min
#   raystart      bench_ray_start.py: ray.init of a local cluster as the job calls it and with one
#                 setting changed (CPUs, node address, object store, metrics), each in a fresh process,
#                 with each run's session logs read into a timeline (RS_REPS, default 2)  ~1-2 min
#   startup       gst-launch of 2 frames through the default model, 96x64 and 1080p, LATENT_CUDNN_FUSION
#                 on/precompiled/off, timed, with the fused graphs' build time  ~1 min
#   multigpu      (several GPUs; after pygi) test_gst_cuda's GstCudaDevices tests, then bench_multigpu.py: the default model's
#                 vaeencode ! vaedecode per device alone, all in one process, one process each  ~3 min
#   decodestart   (after pygi) bench_decode_start.py: each clip's start in 1-16 decode-only pipelines spread
#                 over the GPUs, nvh264dec vs openh264dec (where the precompute job's clip starts go)  ~2 min
#   nvdec         bench_stream_nvdec.py: H.264 file ! nvh264dec ! vaeencode ! vaedecode at 1080p vs the kernel bound  ~2 min
#   video         bench_video_vae.py: Wan 2.1 VAE, 81 frames at 832x480 / 1280x720 + ~1,000-frame
#                 streams, eager+compile+ours (VIDEO_SIZES VIDEO_PARTS VIDEO_COMPILE VIDEO_BUDGET)  ~6-9 min
#   videoab       bench_video_ab.py: latent-bench-video on the Wan 2.1 streams, as is (A) against AB_ENV
#                 (default LATENT_VIDEO_CACHE=copy) alternated (AB_SIZES AB_PARTS AB_FRAMES AB_REPS)  ~1-2 min
#   convab        test_cuda_ops' convolution tests, then bench_conv as is (A) and with CONVAB_ENV (NAME=VALUE,
#                 required, e.g. LATENT_CONV_WGMMA_TILE=256x96) twice each, alternated; CONVAB_ONLY narrows
#                 the shapes  ~4 min
#   attention     /tmp/dev/bin/bench_attention (ATTN_ARGS), skipped if absent  ~1-3 min
#   dit           bench_dit.py: full-size DiT step, eager + regional compile + ours, DIT_CASES  ~5-7 min
#                 (DIT_ACCURACY=1: also the fp32 reference in the same run, one weight write and one ours load)
#   dit-accuracy  bench_dit.py --accuracy: torch bf16 and ours vs PyTorch fp32, no compile      ~4-5 min
# e.g. STEPS="vae-flux vae-taesd"; STEPS="pipelines stream attention"; STEPS="dit"; STEPS="dit-accuracy".
# Knobs: BENCH_SIZES BENCH_PARTS BENCH_COMPILE VAE_BUDGET VAE_TIMEOUT PIPE_BUDGET PIPE_TIMEOUT PIPE_REPEAT
#        DIT_CASES DIT_LAYERS DIT_COMPILE DIT_TIMEOUT DIT_ACC_TIMEOUT DIT_REF_MODE ATTN_ARGS ATTN_TIMEOUT
set -uo pipefail
FINAL=${OUT:-/tmp/out}
OUT=/tmp/res; rm -rf $OUT; mkdir -p $OUT  # an earlier call on a warm machine left its results there
SUMMARY=$OUT/summary.txt; : > $SUMMARY
finish() {
  echo; echo "==== summary ($(date -u +%H:%M:%S), $SECONDS s) ===="; cat $SUMMARY
  tar czf $FINAL/results.tgz -C /tmp/res .
}
trap finish EXIT
trap 'echo "killed (TERM/INT) during step ${CUR:-?}" >> $SUMMARY; exit 143' TERM INT
STEPS=${STEPS:-tests gst fixtures bench pipelines}
export PYTHONUNBUFFERED=1
# A call on a warm machine may leave the build carry out and use the one an earlier call unpacked.
if [ -f .carry/dev.tar.xz ]; then tar xJf .carry/dev.tar.xz -C /tmp || exit 1; fi
[ -f /tmp/dev/env.sh ] || { echo "no build carry: carry .carry/dev.tar.xz (scripts/device/build-carry.sh)"; exit 1; }
. /tmp/dev/env.sh
NV=$(python3 -c "import nvidia,glob,os;print(':'.join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d+'/**/lib*.so*',recursive=True)})))" 2>/dev/null)
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH${NV:+:$NV}
export LATENT_FIXTURES=$PWD/tests/fixtures LATENT_DEFAULT_MODEL=$PWD/models/default
# The GStreamer runtime (../shared/device/gst-runtime.sh) for gst-launch and the gst tests.
G=$PWD/.gstrt; export PATH=$G/bin:$PATH LD_LIBRARY_PATH=$G/lib:$LD_LIBRARY_PATH GST_PLUGIN_SYSTEM_PATH_1_0=$G/lib/gstreamer-1.0 GST_PLUGIN_SCANNER_1_0=$G/libexec/gst-plugin-scanner GST_REGISTRY_1_0=/tmp/gstrt-registry.bin GST_CUDA_NVRTC_LIBNAME=$G/lib/libgstrt-nvrtc-shim.so
nvidia-smi -L
nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader
df -h /tmp /dev/shm 2>/dev/null | tail -2
ldd /tmp/dev/bin/latent-tool | grep "not found"
echo "gpu: $(nvidia-smi -L | head -1 | cut -c1-60); steps: $STEPS" >> $SUMMARY
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
PYOK=
pyenv() {  # diffusers (carried wheel) for the Python benches, installed once
  [ -n "$PYOK" ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
  export PYTHONPATH=/tmp/site; PYOK=1
}
# PyGObject for the device's python3, built once (the pygi step, or the first step that needs it)
pygi_ready() { [ -f /tmp/pygi/env.sh ] || timeout 240 bash scripts/device/pygi-build.sh > $OUT/pygi.log 2>&1; }
# test_gst_cuda once a call: the first step that wants it runs it into $OUT/$1 and reports it
# (trc: its exit status, tline: a summary line); after that, or after the gsttests step (which
# reports it itself), trc=0 and tline is empty
GST_CUDA_RAN=
gst_cuda_once() {
  trc=0 tline=""
  [ -n "$GST_CUDA_RAN" ] && return 0
  GST_CUDA_RAN=1
  timeout 300 /tmp/dev/bin/test_gst_cuda --gtest_color=no > $OUT/$1 2>&1
  trc=$?
  tline="test_gst_cuda: exit $trc $(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/$1 | tr '\n' ' ')"
}
T=0
begin() { CUR=$1; T=$SECONDS; echo; echo "==== $1 ($(date -u +%H:%M:%S)) ===="; }
# end STEP RC [summary lines...]: one line per step in the summary, plus what the step adds
end() {
  local s=$1 rc=$2; shift 2
  local why=""; [ "$rc" = 124 ] && why=" (timeout)"
  echo "$s: exit $rc$why, $((SECONDS - T)) s" >> $SUMMARY
  for l in "$@"; do [ -n "$l" ] && echo "$l" | sed 's/^/  /' >> $SUMMARY; done
  CUR=
}
# the table a bench script prints last (from its header line on), for the summary
table() { [ -f "$1" ] && awk -v h="$2" 'index($0,h)==1{p=1} p' "$1" | grep -v '^$' | cut -c1-150 | head -${3:-30}; }

if has tests; then
  begin tests
  for b in /tmp/dev/bin/test_cuda_* /tmp/dev/bin/test_gst_*; do  # the CPU model tests run in CI
    t=$(basename $b); [ -x $b ] || continue
    timeout 300 /tmp/dev/bin/$t --gtest_color=no > $OUT/$t.log 2>&1
    echo "$t: exit $? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' $OUT/$t.log | tr '\n' ' ')" | tee -a $OUT/tests.log
  done
  grep -E "bf16 rel L2" $OUT/test_cuda_models.log | head -20
  grep -hE "^\[  FAILED  \] [A-Za-z]" $OUT/test_*.log 2>/dev/null | cut -c1-160 | sort -u | head -30 | tee -a $OUT/tests.log
  end tests 0 "$(grep -c ': exit 0 ' $OUT/tests.log) of $(grep -c ': exit ' $OUT/tests.log) test binaries exit 0" \
    "$(grep -hE '^\[  FAILED  \] [A-Za-z]' $OUT/test_*.log 2>/dev/null | cut -c1-120 | sort -u | head -8)"
fi

if has gst; then
  begin gst
  (
    gst-inspect-1.0 latent 2>&1 | head -12
    for m in models/default tests/fixtures/qwen_image_vae_tiny; do
      for size in 1024x1024 1920x1080; do
        w=${size%x*}; h=${size#*x}
        /usr/bin/time -f "%e s wall" timeout 120 gst-launch-1.0 -q videotestsrc num-buffers=60 ! video/x-raw,format=RGB,width=$w,height=$h ! \
          vaeencode model=$m device=cuda ! vaedecode model=$m device=cuda ! fakesink sync=false 2>&1 | tail -3
        echo "^ gst cuda $m $size 60 frames"
      done
    done ) > $OUT/gst.log 2>&1
  tail -30 $OUT/gst.log
  end gst 0 "$(grep -B1 '^\^ gst' $OUT/gst.log | grep -v '^--' | paste - - | sed 's/\^ gst cuda //' | head -4)"
fi

if has fixtures && [ -f .carry/ref/taesd.py ]; then
  begin fixtures
  pyenv
  timeout 300 python3 scripts/make_fixtures.py --out /tmp/fx --device cuda --taesd-py .carry/ref/taesd.py > $OUT/fixtures.log 2>&1
  rc=$?; echo "fixtures: exit $rc"; tail -3 $OUT/fixtures.log
  # video fixtures: diffusers on CUDA against the committed (CPU-made) files
  timeout 200 python3 scripts/make_video_fixtures.py --out tests/fixtures --device cuda --check > $OUT/video-fixtures.log 2>&1
  vrc=$?; echo "video fixtures --check: exit $vrc"; tail -4 $OUT/video-fixtures.log
  [ $rc = 0 ] && rc=$vrc
  tar czf $OUT/fixtures.tgz -C /tmp/fx .
  end fixtures $rc
fi

vae() {  # vae STEP MODELS
  begin $1; pyenv
  timeout ${VAE_TIMEOUT:-330} python3 bench/bench_vae.py --tool /tmp/dev/bin/latent-tool --out $OUT/bench-$1.json \
    --workdir /tmp/latent-bench --models $2 --sizes ${BENCH_SIZES:-512x512,1024x1024,1280x720,1920x1088} \
    --parts ${BENCH_PARTS:-encoder,decoder} --compile ${BENCH_COMPILE:-static} --budget-s ${VAE_BUDGET:-280} \
    --repeat 10 > $OUT/$1.log 2>&1
  local rc=$?
  grep -E '^# .* s to compile|^# budget|^# wrote' $OUT/$1.log | cut -c1-160
  end $1 $rc "$(table $OUT/$1.log 'model  part')"
}
has bench && vae bench ${BENCH_MODELS:-qwen}
has vae-qwen && vae vae-qwen qwen
has vae-flux && vae vae-flux flux
has vae-taesd && vae vae-taesd taesd
has vae-default && vae vae-default default

if has pipelines; then
  begin pipelines; pyenv
  timeout ${PIPE_TIMEOUT:-450} python3 bench/bench_pipelines.py --models $PWD/models/default,qwen \
    --qwen-dir /tmp/latent-bench/qwen --budget-s ${PIPE_BUDGET:-400} --repeat ${PIPE_REPEAT:-1} --out $OUT/bench-pipelines.json > $OUT/pipelines.log 2>&1
  rc=$?; tail -25 $OUT/pipelines.log
  end pipelines $rc "$(table $OUT/pipelines.log 'model ')"
fi

if has gsttests; then  # the elements' GPU tests alone (what a change to the elements needs)
  begin gsttests; GST_CUDA_RAN=1
  for t in test_gst_cuda test_gst_dit_cuda test_gst_video_cuda; do
    timeout 300 /tmp/dev/bin/$t --gtest_color=no > $OUT/$t.log 2>&1
    echo "$t: exit $? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' $OUT/$t.log | tr '\n' ' ')" | tee -a $OUT/gsttests.log
  done
  grep -hE "^\[  FAILED  \] [A-Za-z]" $OUT/test_gst_*.log 2>/dev/null | cut -c1-160 | sort -u | tee -a $OUT/gsttests.log
  end gsttests 0 "$(cat $OUT/gsttests.log)"
fi

if has pinned; then
  begin pinned; pyenv
  gst_cuda_once pinned-tests.log
  timeout ${PINNED_TIMEOUT:-300} python3 bench/bench_pipelines.py --models $PWD/models/default \
    --sizes ${PINNED_SIZES:-1920x1080} --memory system,system-queue --prefetch-depths default \
    --cuda-graphs off --repeat ${PINNED_REPEAT:-3} --ab-env LATENT_PINNED_INPUT=0,1 \
    --out $OUT/bench-pipelines-pinned-ab.json > $OUT/pinned.log 2>&1
  rc=$?; tail -8 $OUT/pinned.log
  if [ -n "${FENCE_AB:-}" ]; then  # latents pushed before their write has run, or waited for
    LATENT_PINNED_INPUT=${FENCE_AB_PINNED:-1} timeout ${PINNED_TIMEOUT:-300} python3 bench/bench_pipelines.py \
      --models $PWD/models/default --sizes ${PINNED_SIZES:-1920x1080} --memory ${FENCE_AB_MEMORY:-system,system-queue} \
      --prefetch-depths default --cuda-graphs off --repeat ${FENCE_AB_REPEAT:-2} \
      --ab-env LATENT_FENCED_LATENTS=0,1 --out $OUT/bench-pipelines-fence-ab.json > $OUT/fence.log 2>&1
    tail -8 $OUT/fence.log
  fi
  [ $rc = 0 ] && rc=$trc
  end pinned $rc "$tline" "$(table $OUT/pinned.log 'model ')" "$(table $OUT/fence.log 'model ')"
fi

if has stageorder; then  # issue 13's one-thread row: where the frame time goes, and the stager's slot order
  begin stageorder; pyenv
  gst_cuda_once stageorder-tests.log
  timeout 120 python3 bench/pipeline_thread_times.py --frames 400 --out $OUT/thread-times.json \
    host:LATENT_STAGE_ORDER=host device:LATENT_STAGE_ORDER=device \
    host-fenced:LATENT_STAGE_ORDER=host,LATENT_FENCED_LATENTS=1 \
    device-fenced:LATENT_STAGE_ORDER=device,LATENT_FENCED_LATENTS=1 queued:queue > $OUT/thread-times.log 2>&1
  rc=$?; tail -8 $OUT/thread-times.log
  for f in ${STAGE_FENCES:-1}; do  # the A/B with the latent fences on (1), off (0) or both ("0 1")
    LATENT_FENCED_LATENTS=$f timeout 150 python3 bench/bench_pipelines.py --models $PWD/models/default \
      --sizes 1920x1080 --memory system,system-queue --prefetch-depths default --cuda-graphs off \
      --repeat ${STAGE_REPEAT:-2} --ab-env LATENT_STAGE_ORDER=host,device \
      --out $OUT/bench-pipelines-stage-order-fenced$f.json > $OUT/stageorder-fenced$f.log 2>&1
    frc=$?; tail -8 $OUT/stageorder-fenced$f.log; [ $rc = 0 ] && rc=$frc
  done
  [ $rc = 0 ] && rc=$trc
  end stageorder $rc "$tline" "$(grep -E '^\[  FAILED  \] [A-Z]' $OUT/stageorder-tests.log 2>/dev/null | sort -u | head -8)" \
    "$(tail -7 $OUT/thread-times.log)" \
    "$(for f in ${STAGE_FENCES:-1}; do table $OUT/stageorder-fenced$f.log 'model '; done)"
fi

if has stream; then
  begin stream; pyenv
  timeout ${STREAM_TIMEOUT:-240} python3 bench/bench_pipelines.py --stream-only --tool /tmp/dev/bin/latent-tool \
    --models $PWD/models/default,qwen --qwen-dir /tmp/latent-bench/qwen --out $OUT/bench-stream.json > $OUT/stream.log 2>&1
  rc=$?; tail -12 $OUT/stream.log
  end stream $rc "$(table $OUT/stream.log 'stream model')" "$(grep 'stream: skipped' $OUT/stream.log)"
fi

if has pipes; then
  begin pipes
  for p in cuda_memory gpu_prefetch latents_cuda_memory; do
    [ -f pipelines/$p.sh ] || continue
    LATENT_OUT_DIR=/tmp/pipes timeout 240 bash pipelines/$p.sh > $OUT/pipe-$p.log 2>&1
    echo "pipelines/$p.sh: exit $? $(tail -1 $OUT/pipe-$p.log | cut -c1-140)" | tee -a $OUT/pipes.log
  done
  end pipes 0 "$(cat $OUT/pipes.log)"
fi

if has taehv && [ -f .carry/ref/taehv.py ]; then
  begin taehv; pyenv
  timeout ${TAEHV_TIMEOUT:-300} python3 bench/bench_taehv.py --taehv-py .carry/ref/taehv.py \
    --bench /tmp/dev/bin/latent-bench-video --out $OUT/bench-taehv.json > $OUT/taehv.log 2>&1
  rc=$?; tail -14 $OUT/taehv.log
  end taehv $rc "$(tail -12 $OUT/taehv.log | cut -c1-150)"
fi

if has pygi && [ -d .carry/pygi ]; then
  begin pygi
  timeout 240 bash scripts/device/pygi-build.sh > $OUT/pygi.log 2>&1
  rc=$?; tail -5 $OUT/pygi.log
  if [ $rc = 0 ]; then
    . /tmp/pygi/env.sh
    python3 -c "import gi; gi.require_version('Gst','1.0'); from gi.repository import Gst; Gst.init(None); print('gi ok', Gst.version_string())" >> $OUT/pygi.log 2>&1; rc=$?
    tail -2 $OUT/pygi.log
  fi
  end pygi $rc "$(tail -2 $OUT/pygi.log | cut -c1-150)"
fi

if has startup; then  # where a pipeline's start-up goes: 2 frames through the default model
  begin startup
  for size in 96x64 1920x1080; do for fusion in on precompiled off; do
    w=${size%x*}; h=${size#*x}
    t0=$(date +%s.%N)
    LATENT_CUDNN_FUSION=$fusion GST_DEBUG=latent*:4 GST_DEBUG_NO_COLOR=1 timeout 120 gst-launch-1.0 -q videotestsrc num-buffers=2 \
      pattern=black ! video/x-raw,format=NV12,width=$w,height=$h ! cudaupload ! "video/x-raw(memory:CUDAMemory)" ! \
      vaeencode model=$PWD/models/default device=cuda ! vaedecode model=$PWD/models/default device=cuda ! fakesink \
      > $OUT/startup-$size-$fusion.log 2>&1
    rc=$?; t1=$(date +%s.%N)
    built=$(grep -o 'built in [0-9.]* ms' $OUT/startup-$size-$fusion.log | awk '{n++; s+=$3} END {printf "%d graphs built in %.0f ms", n, s}')
    echo "$size fusion=$fusion: exit $rc, $(python3 -c "print(round($t1 - $t0, 2))") s; $built" | tee -a $OUT/startup.log
  done; done
  end startup 0 "$(cat $OUT/startup.log | cut -c1-220)"
fi

if has multigpu; then
  begin multigpu; pyenv
  timeout 300 /tmp/dev/bin/test_gst_cuda --gtest_color=no --gtest_filter='GstCudaDevices.*' > $OUT/multigpu-test.log 2>&1
  rc=$?; tail -4 $OUT/multigpu-test.log
  pygi_ready
  ( . /tmp/pygi/env.sh && timeout ${MULTI_TIMEOUT:-300} python3 bench/bench_multigpu.py --model $PWD/models/default \
    ${MULTI_ARGS:-} --out $OUT/bench-multigpu.json ) > $OUT/multigpu.log 2>&1
  rc2=$?; tail -12 $OUT/multigpu.log
  end multigpu $((rc | rc2)) "test_gst_cuda GstCudaDevices: exit $rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' $OUT/multigpu-test.log | tr '\n' ' ')" \
    "$(table $OUT/multigpu.log 'run ')"
fi

if has decodestart; then  # after pygi: clip starts of decode-only pipelines, 1-16 over every GPU
  begin decodestart
  pygi_ready
  ( . /tmp/pygi/env.sh && timeout ${DS_TIMEOUT:-300} python3 bench/bench_decode_start.py \
    --pipelines ${DS_PIPELINES:-1,4,8,16} --out $OUT/bench-decode-start.json ) > $OUT/decodestart.log 2>&1
  rc=$?; tail -10 $OUT/decodestart.log
  end decodestart $rc "$(table $OUT/decodestart.log 'decoder ')"
fi

if has raystart; then  # where a local Ray cluster's start goes (Ray unpacked to /tmp/ray-site first)
  begin raystart; pyenv
  PYTHONPATH=$PYTHONPATH:/tmp/ray-site timeout ${RS_TIMEOUT:-240} python3 bench/bench_ray_start.py \
    --reps ${RS_REPS:-2} --out $OUT/bench-ray-start.json > $OUT/raystart.log 2>&1
  rc=$?; grep -v '^{' $OUT/raystart.log | tail -12 | cut -c1-600
  end raystart $rc "$(grep -v '^{' $OUT/raystart.log | grep -v timeline | tail -6)"
fi

if has precompute; then  # after pygi (the job needs PyGObject); the local engine unless Ray is carried
  begin precompute; pyenv
  pygi_ready
  # PRE_MODELS: model paths, comma-separated (default: the built-in default model); wan21 among
  # them names the Wan 2.1 VAE (diffusers' default config, random weights, bf16), made here
  PRE_MODELS=${PRE_MODELS:-$PWD/models/default}
  case ",$PRE_MODELS," in *,wan21,*)
    wan=$(cd bench && python3 -c \
      "from bench_stream_nvdec import ensure_wan; print(ensure_wan('/tmp/latent-bench'))" | tail -1)
    PRE_MODELS=$(echo ",$PRE_MODELS," | sed "s|,wan21,|,$wan,|; s|^,||; s|,\$||") ;;
  esac
  # Ray (2.60, cp312) where a first call unpacked it: .carry/ray-a.tar.xz to /tmp/ray-site.
  [ -d /tmp/ray-site/ray ] && export PYTHONPATH=$PYTHONPATH:/tmp/ray-site
  ( . /tmp/pygi/env.sh && LATENT_VENV=${LATENT_VENV:-$(dirname "$(dirname "$(command -v python3)")")} \
    PYTHONPATH=$PWD/python:$PYTHONPATH timeout ${PRE_TIMEOUT:-420} python3 bench/bench_precompute.py \
    --models $PRE_MODELS --clips ${PRE_CLIPS:-8} --frames 81 --engine ${PRE_ENGINES:-local} \
    --gpus ${PRE_GPUS:-1} ${PRE_ARGS:-} --out $OUT/bench-precompute.json ) > $OUT/precompute.log 2>&1
  rc=$?; grep -v "OpenH264\|XDG" $OUT/precompute.log | tail -8
  end precompute $rc "$(grep -v 'OpenH264\|XDG' $OUT/precompute.log | tail -6 | cut -c1-150)"
fi

if has nvdec; then
  begin nvdec; pyenv
  timeout ${NVDEC_TIMEOUT:-300} python3 bench/bench_stream_nvdec.py --models ${NVDEC_MODELS:-$PWD/models/default} \
    --qwen-dir /tmp/latent-bench/qwen --tool /tmp/dev/bin/latent-tool --out $OUT/bench-nvdec.json > $OUT/nvdec.log 2>&1
  rc=$?; tail -8 $OUT/nvdec.log
  end nvdec $rc "$(table $OUT/nvdec.log 'pipeline ')"
fi

if has video; then
  begin video; pyenv
  timeout ${VIDEO_TIMEOUT:-570} python3 bench/bench_video_vae.py --tool /tmp/dev/bin/latent-tool \
    --out $OUT/bench-video.json --workdir /tmp/latent-bench --sizes ${VIDEO_SIZES:-832x480,1280x720} \
    --parts ${VIDEO_PARTS:-encoder,decoder} --compile ${VIDEO_COMPILE:-static} \
    --budget-s ${VIDEO_BUDGET:-480} > $OUT/video.log 2>&1
  rc=$?; tail -14 $OUT/video.log
  end video $rc "$(table $OUT/video.log 'part    size')"
fi

if has videoab; then  # one engine setting A/B on the Wan 2.1 streams, same binary, alternated
  begin videoab; pyenv
  timeout ${AB_TIMEOUT:-300} python3 bench/bench_video_ab.py --bench /tmp/dev/bin/latent-bench-video \
    --b-env ${AB_ENV:-LATENT_VIDEO_CACHE=copy} --sizes ${AB_SIZES:-1280x720} --parts ${AB_PARTS:-encoder,decoder} \
    --frames ${AB_FRAMES:-161} --reps ${AB_REPS:-2} --out $OUT/bench-video-ab.json > $OUT/videoab.log 2>&1
  rc=$?; tail -8 $OUT/videoab.log
  end videoab $rc "$(table $OUT/videoab.log 'part     size')"
fi

# a convolution kernel change: its tests, then bench_conv A/B in one binary
if has convab && [ -z "${CONVAB_ENV:-}" ]; then
  echo "convab: skipped (set CONVAB_ENV=NAME=VALUE, variant B)" >> $SUMMARY
elif has convab; then
  begin convab
  timeout 240 /tmp/dev/bin/test_cuda_ops --gtest_color=no --gtest_filter='*Conv*' > $OUT/convab-tests.log 2>&1
  trc=$?; grep -E '^\[  (PASSED|FAILED)  \]' $OUT/convab-tests.log | head -12
  for rep in 1 2; do
    timeout 120 /tmp/dev/bin/bench_conv --reps 10 ${CONVAB_ONLY:+--only "$CONVAB_ONLY"} > $OUT/convab-a$rep.log 2>&1
    env ${CONVAB_ENV} timeout 120 /tmp/dev/bin/bench_conv --reps 10 ${CONVAB_ONLY:+--only "$CONVAB_ONLY"} > $OUT/convab-b$rep.log 2>&1
  done
  python3 - $OUT "${CONVAB_ENV}" > $OUT/convab.txt <<'PY'
import json, sys, glob, statistics
out, benv = sys.argv[1], sys.argv[2]
rows = {}
for f in sorted(glob.glob(out + "/convab-[ab]?.log")):
    ab = f.split("convab-")[1][0]
    for line in open(f):
        if line.startswith("{"):
            j = json.loads(line)
            rows.setdefault((j["shape"], j["variant"]), {}).setdefault(ab, []).append(j["ms"])
print(f"A: as is; B: {benv}; median of 2 runs of bench_conv's median ms")
print(f"{'shape':30} {'kernel':6} {'A ms':>8} {'B ms':>8} {'B/A':>6}")
for (shape, var), d in rows.items():
    a, b = statistics.median(d.get("a", [float("nan")])), statistics.median(d.get("b", [float("nan")]))
    print(f"{shape:30} {var:6} {a:8.3f} {b:8.3f} {b / a:6.2f}")
PY
  cat $OUT/convab.txt
  end convab $trc "$(grep -E '^\[  (PASSED|FAILED)  \]' $OUT/convab-tests.log | head -4)" "$(cat $OUT/convab.txt)"
fi

if has attention; then
  begin attention
  if [ -x /tmp/dev/bin/bench_attention ]; then
    timeout ${ATTN_TIMEOUT:-240} /tmp/dev/bin/bench_attention ${ATTN_ARGS:-} > $OUT/attention.log 2>&1
    rc=$?; tail -20 $OUT/attention.log
    end attention $rc "$(grep -v '^{' $OUT/attention.log | tail -12 | cut -c1-150)"
  else
    echo "no /tmp/dev/bin/bench_attention in dev.tar.xz: skipped"
    end attention skipped "no /tmp/dev/bin/bench_attention (add it to LATENT_DEVICE_TESTS targets in build-carry.sh)"
  fi
fi

if has dit; then
  begin dit; pyenv
  timeout ${DIT_TIMEOUT:-540} python3 bench/bench_dit.py --tool /tmp/dev/bin/latent-tool --out $OUT/bench-dit.json \
    --layers ${DIT_LAYERS:-60} --cases ${DIT_CASES:-t2i,edit} --compile ${DIT_COMPILE:-regional} \
    ${DIT_ACCURACY:+--accuracy --ref-mode ${DIT_REF_MODE:-auto}} > $OUT/dit.log 2>&1
  rc=$?; tail -12 $OUT/dit.log
  end dit $rc "$(grep -E '\] (built|wrote)|weights already|compile took|fp32 reference' $OUT/dit.log | cut -c1-120)" "$(table $OUT/dit.log 'case ' 4)"
fi

if has dit-accuracy; then
  begin dit-accuracy; pyenv
  timeout ${DIT_ACC_TIMEOUT:-540} python3 bench/bench_dit.py --tool /tmp/dev/bin/latent-tool --out $OUT/bench-dit-accuracy.json \
    --layers ${DIT_LAYERS:-60} --cases ${DIT_CASES:-t2i,edit} --compile none --skip-torch --accuracy \
    --ref-mode ${DIT_REF_MODE:-auto} > $OUT/dit-accuracy.log 2>&1
  rc=$?; tail -12 $OUT/dit-accuracy.log
  end dit-accuracy $rc "$(grep -E '\] (built|wrote)|weights already|fp32 reference' $OUT/dit-accuracy.log | cut -c1-140)" "$(table $OUT/dit-accuracy.log 'case ' 4)"
fi
