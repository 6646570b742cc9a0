#!/usr/bin/env python3
"""One denoising step (one transformer forward) of the full-size Qwen-Image MMDiT (random
weights, bf16, ~41 GB) at 1024x1024 (4,096 image tokens; edit: 8,192 = target + reference),
gst-latent next to PyTorch eager and torch.compile in the same run, on the GPU machine, and
(--accuracy) both bf16 outputs against PyTorch in fp32 on the same weights.

  python3 bench/bench_dit.py --tool /tmp/dev/bin/latent-tool --out bench/results/dit.json
  python3 bench/bench_dit.py --tool ... --cases t2i --compile none --accuracy --out acc.json
  python3 bench/bench_dit.py --smoke --device cpu --tool build/tools/latent-tool   # CPU dry run

Phases, each optional, in an order that keeps at most one 41 GB copy of the weights on the GPU:
  1. weights: built directly in bf16 on the GPU (default dtype bf16 while the model is made, so no
     82 GB fp32 copy exists), written once as safetensors shards by parallel writers to --workdir
     (`auto`: /dev/shm when it has room, else /tmp); skipped when the folder holds a complete
     write of the same config and seed (`bench_dit_stamp.json`).
  2. PyTorch bf16 eager (--skip-torch skips 2 and 3).
  3. torch.compile: `regional` (default; diffusers' compile_repeated_blocks(fullgraph=True): one
     QwenImageTransformerBlock graph shared by the 60 blocks; falls back to fullgraph=False if
     that raises), `full` (torch.compile of the whole model; > 5 min for 60 layers) or `none`.
     Compile wall time is `compile_s`.
  4. --accuracy: PyTorch fp32 on the same weights (bf16 values upcast, TF32 off). `--ref-mode
     full` upcasts the whole model (82 GB: H200 only), `layerwise` keeps the weights in bf16 and
     upcasts each block just before it runs (exact, since bf16 -> fp32 -> bf16 is lossless; 41 GB
     + one block), `auto` picks full when the GPU has >= 120 GB. The JSON says which (`ref_mode`).
  5. ours: `latent-tool run --part transformer` on the same folder and inputs (--skip-ours skips).
  5b. --fp8: ours again with `--dtype fp8` (the blocks' linear layers quantised to FP8 e4m3 at load,
     inputs per token: cuBLASLt FP8 on Hopper); its time, speed-up over torch.compile bf16 and its
     relative L2 against fp32 (with --accuracy), PyTorch bf16 and our bf16 output.
  6. --lora-rank R (e.g. 64): a random rank-R LoRA on every linear layer of the 60 blocks
     (ComfyUI layout, bf16, written once to --workdir), then ours again with it applied at run
     time (`--lora FILE:1 --lora-mode runtime`: the low-rank products computed every step,
     folded into the q/k/v and MLP layers' GEMMs), again at run time with LATENT_LORA_FOLD=0 (two
     GEMMs beside every layer: the A/B), and merged (`--lora-mode merged`: no cost per step).
     The JSON gets `ours_lora_runtime_ms`, `ours_lora_runtime_separate_ms`,
     `ours_lora_merged_ms`, `lora_runtime_cost` / `lora_runtime_separate_cost` (runtime / plain
     - 1; target <= 0.07 at rank 64) and the outputs' relative L2 to the merged one (bf16).
Each phase prints its time; the JSON is rewritten after every phase.

  python3 bench/bench_dit.py --tool ... --cases t2i,edit --skip-torch --lora-rank 64 \
      --out bench/results/dit_lora.json
"""
import argparse
import concurrent.futures
import gc
import json
import os
import shutil
import sys
import time

if "--warm-cache" not in sys.argv:  # cold compile times: fresh Inductor/Triton caches for this run
    import tempfile

    _c = tempfile.mkdtemp(prefix="bench-dit-compile-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_c, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(_c, "triton")

import torch
from safetensors.torch import load_file, save_file

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f} s] {msg}", flush=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def time_fn(fn, warmup, repeat, dev):
    for _ in range(warmup):
        fn()
    sync(dev)
    ts = []
    for _ in range(repeat):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            y = fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            y = fn()
            ts.append((time.perf_counter() - t0) * 1e3)
    ts.sort()
    return ts[len(ts) // 2], y


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def model_config(args):
    if args.smoke:
        return dict(num_layers=args.layers, attention_head_dim=16, num_attention_heads=2,
                    joint_attention_dim=32, axes_dims_rope=(4, 6, 6), zero_cond_t=False)
    return dict(num_layers=args.layers, zero_cond_t=False)


def build_model(cfg, dev, seed):
    """The transformer in bf16 on dev, made with bf16 as the default dtype so its parameters are
    initialised (PyTorch's default init) in bf16 where they live: no fp32 copy (82 GB at full
    size), no host round trip. The RoPE tables are made in explicit fp32 by diffusers."""
    import diffusers

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            torch.manual_seed(seed)
            m = diffusers.QwenImageTransformer2DModel(**cfg)
    finally:
        torch.set_default_dtype(old)
    return m.to(torch.bfloat16).eval()


def pick_workdir(want, need_bytes):
    if want != "auto":
        return want
    try:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > need_bytes * 1.15:
            return "/dev/shm/latent-dit"
    except OSError:
        pass
    return "/tmp/latent-dit"


ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64",
             torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL", torch.float64: "F64"}


def write_safetensors(tensors, path, metadata=None):
    """safetensors format written directly: header, then each tensor's bytes copied from the
    device into one reused pinned buffer and written from it (the copy and the write release the
    GIL, so several of these run in parallel threads). Read back by safetensors and latent-tool."""
    hdr, off = {}, 0
    if metadata:
        hdr["__metadata__"] = metadata
    for k, t in tensors.items():
        n = t.numel() * t.element_size()
        hdr[k] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    biggest = max((t.numel() * t.element_size() for t in tensors.values()), default=0)
    cuda = any(t.is_cuda for t in tensors.values())
    buf = torch.empty(biggest, dtype=torch.uint8, pin_memory=cuda) if biggest else None
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for t in tensors.values():
            n = t.numel() * t.element_size()
            if n == 0:
                continue
            b = buf[:n]
            b.copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
            f.write(memoryview(b.numpy()))
    return off


def write_shards(m, folder, stamp, shard_bytes, writers):
    """diffusers' sharded layout (index + shards + config.json), written by `writers` threads in
    parallel, each shard straight from the device (write_safetensors). Written to a .partial
    folder and renamed at the end, so a killed run leaves no folder that looks complete."""
    tmp = folder + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(tmp)
    sd = m.state_dict()
    shards, cur, size = [], [], 0
    for k, v in sd.items():
        b = v.numel() * v.element_size()
        if cur and size + b > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += b
    if cur:
        shards.append(cur)
    n = len(shards)
    names = [f"diffusion_pytorch_model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]

    def write(i):
        return write_safetensors({k: sd[k] for k in shards[i]}, os.path.join(tmp, names[i]), {"format": "pt"})

    with concurrent.futures.ThreadPoolExecutor(max_workers=writers) as ex:
        total = sum(ex.map(write, range(n)))
    index = {"metadata": {"total_size": total},
             "weight_map": {k: names[i] for i, ks in enumerate(shards) for k in ks}}
    with open(os.path.join(tmp, "diffusion_pytorch_model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    m.save_config(tmp)
    with open(os.path.join(tmp, "bench_dit_stamp.json"), "w") as f:
        json.dump(stamp, f)
    os.rename(tmp, folder)
    return total


BLOCK_LINEARS = ["img_mod.1", "txt_mod.1", "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                 "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
                 "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2"]


def write_lora(m, rank, path, seed):
    """A random rank-`rank` LoRA on every linear layer of the blocks, ComfyUI layout
    (diffusion_model.<m>.lora_down/up.weight + .alpha), bf16; small values so the output stays
    in range (the cost, not the image, is measured)."""
    if os.path.exists(path):
        return os.path.getsize(path)
    g = torch.Generator(device="cpu").manual_seed(seed)
    mods = dict(m.named_modules())
    t = {}
    for i in range(len(m.transformer_blocks)):
        for name in BLOCK_LINEARS:
            full = f"transformer_blocks.{i}.{name}"
            out_f, in_f = mods[full].weight.shape
            k = f"diffusion_model.{full}"
            t[k + ".lora_down.weight"] = (torch.randn((rank, in_f), generator=g) / in_f ** 0.5).to(torch.bfloat16)
            t[k + ".lora_up.weight"] = (torch.randn((out_f, rank), generator=g) * 0.01).to(torch.bfloat16)
            t[k + ".alpha"] = torch.tensor(float(rank), dtype=torch.bfloat16)
    save_file(t, path + ".tmp", metadata={"generator": "bench/bench_dit.py", "rank": str(rank)})
    os.replace(path + ".tmp", path)
    return os.path.getsize(path)


def case_inputs(case, args, g):
    h = w = args.latent_grid  # 64: latent 128x128 / 2x2 patches = 4096 tokens (1024x1024 image)
    n_img = 1 if case == "t2i" else 2
    tokens = n_img * h * w
    joint = 32 if args.smoke else 3584
    # bf16-representable values, so the bf16 runs and the fp32 reference see the same inputs
    x = torch.randn(1, tokens, 64, generator=g).bfloat16().float()
    txt = torch.randn(1, args.text_tokens, joint, generator=g).bfloat16().float()
    mask = torch.ones(1, args.text_tokens)
    mask[:, args.text_tokens * 3 // 4:] = 0
    t = torch.tensor([0.6]).bfloat16().float()
    shapes = [(1, h, w)] * n_img
    return dict(x=x, txt=txt, mask=mask, t=t, shapes=shapes, tokens=tokens)


def forward_fn(model, ci, dev, dtype):
    inputs = dict(hidden_states=ci["x"].to(dev, dtype), encoder_hidden_states=ci["txt"].to(dev, dtype),
                  encoder_hidden_states_mask=ci["mask"].to(dev, dtype), timestep=ci["t"].to(dev, dtype))
    shapes = ci["shapes"]
    return lambda: model(**inputs, img_shapes=[shapes], return_dict=False)[0]


def fp32_reference(m, cis, dev, mode):
    """PyTorch fp32 outputs on m's bf16 weights (upcast), TF32 off. Leaves m in bf16."""
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hooks = []
    try:
        if mode == "full":
            m.float()
        else:
            for name, child in m.named_children():
                if name != "transformer_blocks":
                    child.float()

            def up(mod, args):
                mod.float()

            def down(mod, args, out):
                mod.to(torch.bfloat16)

            for blk in m.transformer_blocks:
                hooks.append(blk.register_forward_pre_hook(up))
                hooks.append(blk.register_forward_hook(down))
        outs = []
        for ci in cis:
            t0 = time.time()
            fn = forward_fn(m, ci, dev, torch.float32)
            outs.append(fn().float().cpu())
            sync(dev)
            outs[-1] = (outs[-1], round(time.time() - t0, 1))
            del fn
    finally:
        for h in hooks:
            h.remove()
        m.to(torch.bfloat16)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return outs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="/tmp/dev/bin/latent-tool", help="latent-tool; 'none' = --skip-ours")
    ap.add_argument("--out", default="bench/results/dit.json")
    ap.add_argument("--workdir", default="auto", help="weights + inputs; auto: /dev/shm if it has room, else /tmp")
    ap.add_argument("--layers", type=int, default=60, help="60 = full size; fewer for a quick look")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text-tokens", type=int, default=128)
    ap.add_argument("--latent-grid", type=int, default=64, help="patches per side (64: 1024x1024)")
    ap.add_argument("--cases", default="t2i,edit")
    ap.add_argument("--compile", default="regional", choices=["regional", "full", "none"])
    ap.add_argument("--accuracy", action="store_true", help="fp32 reference; rel. L2 of both bf16 outputs to it")
    ap.add_argument("--ref-mode", default="auto", choices=["auto", "full", "layerwise"])
    ap.add_argument("--skip-torch", action="store_true", help="no PyTorch timing (eager, compile)")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--ours-timeout", type=int, default=300)
    ap.add_argument("--warm-cache", action="store_true",
                    help="keep the default Inductor/Triton caches (else fresh ones: cold compile times)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ours-device", default=None, help="latent-tool --device (default: --device)")
    ap.add_argument("--ours-dtype", default="bf16")
    ap.add_argument("--smoke", action="store_true", help="tiny config (2 layers, 8x8 grid, 8 text tokens)")
    ap.add_argument("--fp8", action="store_true",
                    help="ours again with --dtype fp8 (the blocks' linear layers in FP8 e4m3): "
                         "ours_fp8_ms, fp8_speedup_vs_compile (target >= 1.5 at 4,096 tokens) and "
                         "its relative L2 against torch bf16, fp32 (--accuracy) and ours bf16")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="also time ours with a random LoRA of this rank on every block linear, "
                         "at run time and merged (0: off)")
    args = ap.parse_args()
    if args.smoke:
        if args.layers == 60:
            args.layers = 2
        args.latent_grid, args.text_tokens = min(args.latent_grid, 8), min(args.text_tokens, 8)
    if args.tool == "none":
        args.skip_ours = True
    import diffusers

    dev, dt = torch.device(args.device), torch.bfloat16
    cuda = dev.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    cfg = model_config(args)
    env = {"gpu": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
           "diffusers": diffusers.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
           "config": cfg, "seed": args.seed, "compile": args.compile, "smoke": args.smoke,
           "compile_cache": "default (warm)" if args.warm_cache else "fresh (cold compile)"}
    rows = []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def dump():
        with open(args.out + ".tmp", "w") as f:
            json.dump({**env, "rows": rows}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    # 1. weights
    t0 = time.time()
    m = build_model(cfg, dev, args.seed)
    sync(dev)
    params = sum(p.numel() for p in m.parameters())
    env["parameters"] = params
    env["build_s"] = round(time.time() - t0, 1)
    log(f"built {params / 1e9:.2f}B parameters in bf16 on {dev} in {env['build_s']} s")
    workdir = pick_workdir(args.workdir, 2 * params)
    env["workdir"] = workdir
    os.makedirs(workdir, exist_ok=True)
    folder = os.path.join(workdir, f"transformer-{args.layers}{'-smoke' if args.smoke else ''}")
    stamp = {"config": {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}, "seed": args.seed,
             "init": "bf16-default-dtype", "torch": torch.__version__, "diffusers": diffusers.__version__,
             "device": env["gpu"]}
    try:
        have = json.load(open(os.path.join(folder, "bench_dit_stamp.json")))
    except (OSError, ValueError):
        have = None
    if args.skip_ours:
        env["weights"] = "not written (--skip-ours)"
    elif have == stamp:
        env["weights"] = f"reused {folder}"
        log(f"weights already in {folder}")
    else:
        t0 = time.time()
        total = write_shards(m, folder, stamp, int(args.shard_gb * 1e9), args.writers)
        env["write_s"] = round(time.time() - t0, 1)
        env["weights"] = f"wrote {total / 1e9:.1f} GB to {folder}"
        log(f"wrote {total / 1e9:.1f} GB to {folder} in {env['write_s']} s "
            f"({total / 1e9 / max(env['write_s'], 1e-3):.1f} GB/s)")
    dump()

    cases = args.cases.split(",")
    g = torch.Generator(device="cpu").manual_seed(1)
    cis = [case_inputs(c, args, g) for c in cases]
    for case, ci in zip(cases, cis):
        T = ci["tokens"] + args.text_tokens
        rows.append({"case": case, "image_tokens": ci["tokens"], "text_tokens": args.text_tokens,
                     "layers": args.layers, "parameters": params,
                     # the image and text streams each hold about half the weights and apply them
                     # to their own tokens (2 * params/2 * T), plus joint attention 4 * T^2 * D a layer
                     "flops": params * T + args.layers * 4 * T * T * m.inner_dim})
    outs_bf16 = {}

    with torch.no_grad():
        # 2. eager (its output is also the bf16 reference for ours and the fp32 comparison)
        if not args.skip_torch or args.accuracy:
            for row, ci in zip(rows, cis):
                fn = forward_fn(m, ci, dev, dt)
                if args.skip_torch:
                    outs_bf16[row["case"]] = fn().float().cpu()
                else:
                    row["eager_ms"], y = time_fn(fn, args.warmup, args.repeat, dev)
                    outs_bf16[row["case"]] = y.float().cpu()
                    log(f"{row['case']}: eager {row['eager_ms']:.1f} ms")
                del fn
            dump()
        # 3. torch.compile
        if not args.skip_torch and args.compile != "none":
            for row, ci in zip(rows, cis):
                torch._dynamo.reset()
                t0 = time.time()
                if args.compile == "regional":
                    try:
                        m.compile_repeated_blocks(fullgraph=True, dynamic=False)
                        fullgraph = True
                        fn = forward_fn(m, ci, dev, dt)
                        y = fn()
                    except Exception as e:
                        log(f"regional fullgraph=True failed ({type(e).__name__}: {str(e)[:200]}); fullgraph=False")
                        row["compile_fullgraph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                        torch._dynamo.reset()
                        m.compile_repeated_blocks(fullgraph=False, dynamic=False)
                        fullgraph = False
                        fn = forward_fn(m, ci, dev, dt)
                        y = fn()
                    row["compile_fullgraph"] = fullgraph
                    cm = None
                else:
                    cm = torch.compile(m, dynamic=False)
                    fn = forward_fn(cm, ci, dev, dt)
                    y = fn()
                sync(dev)
                row["compile_kind"] = args.compile
                row["compile_s"] = round(time.time() - t0, 1)
                log(f"{row['case']}: {args.compile} compile took {row['compile_s']} s")
                row["compile_ms"], y = time_fn(fn, args.warmup, args.repeat, dev)
                if row["case"] in outs_bf16:
                    row["compile_vs_eager_rel_l2"] = rel_l2(y.float().cpu(), outs_bf16[row["case"]])
                log(f"{row['case']}: compiled {row['compile_ms']:.1f} ms")
                del fn, y, cm
                if args.compile == "regional":  # back to eager blocks for what follows
                    for blk in m.transformer_blocks:
                        blk._compiled_call_impl = None
                torch._dynamo.reset()
                dump()
        # 4. fp32 reference
        outs_fp32 = {}
        if args.accuracy:
            mode = args.ref_mode
            if mode == "auto":
                total_mem = torch.cuda.get_device_properties(0).total_memory if cuda else 0
                mode = "full" if (not cuda or total_mem >= 120 * 2**30) else "layerwise"
            env["ref_mode"] = mode
            env["ref_note"] = ("fp32 forward of the bf16 weights upcast; "
                               + ("whole model upcast at once" if mode == "full"
                                  else "each block upcast just before it runs, back to bf16 after (exact)")
                               + "; TF32 off")
            if cuda:
                gc.collect()
                torch.cuda.empty_cache()
            refs = fp32_reference(m, cis, dev, mode)
            for row, (ref, secs) in zip(rows, refs):
                outs_fp32[row["case"]] = ref
                row["ref_fp32_s"] = secs
                row["torch_bf16_vs_fp32_rel_l2"] = rel_l2(outs_bf16[row["case"]], ref)
                log(f"{row['case']}: fp32 reference ({mode}) in {secs} s; torch bf16 vs fp32 "
                    f"{row['torch_bf16_vs_fp32_rel_l2']:.2e}")
            dump()
    lora_path = None
    if args.lora_rank > 0 and not args.skip_ours:
        lora_path = os.path.join(workdir, f"lora-r{args.lora_rank}-{args.layers}"
                                          f"{'-smoke' if args.smoke else ''}.safetensors")
        t0 = time.time()
        size = write_lora(m, args.lora_rank, lora_path, args.seed + 7)
        env["lora"] = {"path": lora_path, "rank": args.lora_rank, "bytes": size,
                       "modules": len(m.transformer_blocks) * len(BLOCK_LINEARS)}
        log(f"LoRA rank {args.lora_rank}: {size / 1e9:.2f} GB in {time.time() - t0:.1f} s")
    # 5. ours: free PyTorch's copy of the weights first (41 GB each)
    del m
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    if not args.skip_ours:
        import subprocess

        for row, ci in zip(rows, cis):
            case = row["case"]
            inp = os.path.join(workdir, f"in-{case}-{args.latent_grid}.safetensors")
            outp = os.path.join(workdir, f"out-{case}.safetensors")
            save_file({"hidden_states": ci["x"], "encoder_hidden_states": ci["txt"],
                       "encoder_hidden_states_mask": ci["mask"], "timestep": ci["t"],
                       "img_shapes": torch.tensor(ci["shapes"], dtype=torch.float32)}, inp)
            variants = [("", [], {})]
            if args.fp8:
                variants += [("_fp8", ["--dtype", "fp8"], {})]
            if lora_path:
                runtime = ["--lora", f"{lora_path}:1", "--lora-mode", "runtime"]
                # Runtime LoRAs folded into the layers' GEMMs (the default) and, for the A/B in one
                # run, kept as two GEMMs beside each layer (LATENT_LORA_FOLD=0).
                variants += [("_lora_runtime", runtime, {}),
                             ("_lora_runtime_separate", runtime, {"LATENT_LORA_FOLD": "0"}),
                             ("_lora_merged", ["--lora", f"{lora_path}:1", "--lora-mode", "merged"], {})]
            lora_outs = {}
            ours_bf16 = None
            for suffix, extra, env_extra in variants:
                t0 = time.time()
                outp_v = outp.replace(".safetensors", f"{suffix}.safetensors")
                if "--dtype" not in extra:
                    extra = ["--dtype", args.ours_dtype] + extra
                cmd = [args.tool, "run", "--part", "transformer", "--model", folder, "--inputs", inp,
                       "--outputs", outp_v, "--device", args.ours_device or args.device,
                       "--warmup", str(args.warmup), "--repeat", str(args.repeat), "--json"] + extra
                # A step as a denoising loop runs it, each step a new timestep: --repeat runs one
                # timestep again and again, which the modulation cache would answer after the
                # first (a few-step loop over frames gets that; a single step's figure must not).
                env = dict(os.environ, LATENT_DIT_MOD_CACHE="0", **env_extra)
                try:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ours_timeout,
                                       env=env)
                    ok = p.returncode == 0
                    err = (p.stderr or p.stdout)[-600:]
                except subprocess.TimeoutExpired:
                    ok, err = False, f"timed out after {args.ours_timeout} s"
                key = "ours" + suffix
                row[key + "_wall_s"] = round(time.time() - t0, 1)
                if not ok:
                    row[key + "_error"] = err
                    log(f"{case}: {key} failed: {err[-200:]}")
                    continue
                j = json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])
                row[key + "_ms"], row[key + "_peak_bytes"] = j["median_ms"], j.get("peak_bytes")
                row[key + "_held_bytes"] = j.get("held_bytes")  # reserved from the driver after the runs
                out = next(iter(load_file(outp_v).values())).float()
                if suffix == "_fp8":
                    # FP8 linear layers: against PyTorch bf16, fp32, and our own bf16 output.
                    if case in outs_bf16:
                        row["ours_fp8_vs_torch_rel_l2"] = rel_l2(out, outs_bf16[case])
                    if case in outs_fp32:
                        row["ours_fp8_vs_fp32_rel_l2"] = rel_l2(out, outs_fp32[case])
                    if ours_bf16 is not None:
                        row["ours_fp8_vs_ours_bf16_rel_l2"] = rel_l2(out, ours_bf16)
                    if "compile_ms" in row:
                        row["fp8_speedup_vs_compile"] = row["compile_ms"] / row[key + "_ms"]
                elif suffix:
                    lora_outs[suffix] = out
                else:
                    ours_bf16 = out
                    if case in outs_bf16:
                        row["ours_vs_torch_rel_l2"] = rel_l2(out, outs_bf16[case])
                if not suffix and case in outs_fp32:
                    row["ours_vs_fp32_rel_l2"] = rel_l2(out, outs_fp32[case])
                log(f"{case}: {key} {row[key + '_ms']:.1f} ms (call {row[key + '_wall_s']} s)")
            for v, what in (("runtime", "folded"), ("runtime_separate", "two GEMMs apart")):
                if "ours_ms" in row and f"ours_lora_{v}_ms" in row:
                    row[f"lora_{v}_cost"] = row[f"ours_lora_{v}_ms"] / row["ours_ms"] - 1
                    log(f"{case}: runtime LoRA rank {args.lora_rank} ({what}) costs "
                        f"{100 * row[f'lora_{v}_cost']:.1f} % a step (target <= 7 %)")
            for v in ("_lora_runtime", "_lora_runtime_separate"):
                if v in lora_outs and "_lora_merged" in lora_outs:
                    row[f"lora{v[5:]}_vs_merged_rel_l2"] = rel_l2(lora_outs[v], lora_outs["_lora_merged"])
            dump()
    env["total_s"] = round(time.time() - T0, 1)
    dump()
    nan = float("nan")
    print(f"\n{'case':5} {'tokens':>7} {'eager ms':>9} {'compile ms':>10} {'comp s':>7} {'ours ms':>8} "
          f"{'ours/torch':>10} {'torch/fp32':>10} {'ours/fp32':>10}")
    for r in rows:
        print(f"{r['case']:5} {r['image_tokens']:7} {r.get('eager_ms', nan):9.1f} {r.get('compile_ms', nan):10.1f} "
              f"{r.get('compile_s', nan):7.1f} {r.get('ours_ms', nan):8.1f} {r.get('ours_vs_torch_rel_l2', nan):10.2e} "
              f"{r.get('torch_bf16_vs_fp32_rel_l2', nan):10.2e} {r.get('ours_vs_fp32_rel_l2', nan):10.2e}")
        if "ours_error" in r:
            print("  ours failed:", r["ours_error"][-300:])
        if "ours_fp8_ms" in r:
            print(f"  fp8: {r['ours_fp8_ms']:.1f} ms ({r.get('fp8_speedup_vs_compile', nan):.2f}x torch.compile bf16, "
                  f"target >= 1.5x / <= 100 ms at 4,096 tokens); rel L2 vs fp32 "
                  f"{r.get('ours_fp8_vs_fp32_rel_l2', nan):.2e}, vs torch bf16 {r.get('ours_fp8_vs_torch_rel_l2', nan):.2e}, "
                  f"vs ours bf16 {r.get('ours_fp8_vs_ours_bf16_rel_l2', nan):.2e}")
        elif "ours_fp8_error" in r:
            print("  fp8 failed:", r["ours_fp8_error"][-300:])
        if "ours_lora_runtime_ms" in r or "ours_lora_merged_ms" in r:
            print(f"  LoRA rank {args.lora_rank}: runtime {r.get('ours_lora_runtime_ms', nan):.1f} ms "
                  f"(+{100 * r.get('lora_runtime_cost', nan):.1f} %, target <= 7 %; two GEMMs apart "
                  f"{r.get('ours_lora_runtime_separate_ms', nan):.1f} ms, "
                  f"+{100 * r.get('lora_runtime_separate_cost', nan):.1f} %), merged "
                  f"{r.get('ours_lora_merged_ms', nan):.1f} ms; runtime vs merged "
                  f"{r.get('lora_runtime_vs_merged_rel_l2', nan):.2e} (apart "
                  f"{r.get('lora_runtime_separate_vs_merged_rel_l2', nan):.2e})")
    print(f"(rel. L2; fp32 reference: {env.get('ref_mode', 'not run')}; compile: {args.compile}; "
          f"weights: {env.get('weights')}; {env['total_s']} s)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
