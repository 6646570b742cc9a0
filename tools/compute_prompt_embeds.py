#!/usr/bin/env python3
"""Prompt embeddings for ditdenoise's `prompt-embeds` / `negative-prompt-embeds` properties.

Writes a safetensors file with `prompt_embeds` [1, T, 3584] (fp32 unless --dtype) and
`prompt_embeds_mask` [1, T] (1 = valid token; fp32, since the engine reads float tensors, where
diffusers has int64), exactly what diffusers' QwenImagePipeline.encode_prompt computes with the
Qwen2.5-VL text encoder: the prompt is put in the pipeline's template, tokenised (up to 1024
tokens after the template), run through the text encoder, the hidden states of the last layer
are taken, the 34 template tokens dropped (drop_idx) and the mask kept. diffusers' own code path runs: the pipeline class is built with
only its text encoder and tokenizer (and for --pipeline edit-plus, the processor) loaded, and its
encode_prompt is called. Needs torch, transformers and diffusers, and the model's
text_encoder/ and tokenizer/ folders (a full pipeline checkout such as Qwen/Qwen-Image);
--pipeline edit-plus also needs Pillow and torchvision (transformers' Qwen2VLProcessor builds a
video processor that requires it) and the processor/ folder.
tests/model/test_compute_prompt_embeds.py checks both pipelines on a tiny random model, offline.

    # text-to-image / img2img models (Qwen-Image):
    python3 tools/compute_prompt_embeds.py --model /models/Qwen-Image \\
        --prompt "a watercolour painting, soft washes" --out watercolour.safetensors
    python3 tools/compute_prompt_embeds.py --model /models/Qwen-Image \\
        --prompt " " --out negative.safetensors          # the pipelines' usual negative prompt
    # edit models (Qwen-Image-Edit-2509 / 2511): the prompt is encoded together with the
    # reference image, as QwenImageEditPlusPipeline does (condition image of 384x384 area):
    python3 tools/compute_prompt_embeds.py --model /models/Qwen-Image-Edit-2511 \\
        --pipeline edit-plus --image frame.png --prompt "make it night" --out night.safetensors

    # then:
    gst-launch-1.0 ... ! ditdenoise model=/models/Qwen-Image prompt-embeds=watercolour.safetensors \\
        negative-prompt-embeds=negative.safetensors guidance-scale=4 ! ...

--from-fixture IO.safetensors --case NAME instead copies `NAME.prompt_embeds(_mask)` (and
`NAME.negative_prompt_embeds(_mask)` into --negative-out) from a DiT fixture file such as
tests/fixtures/dit_qwen_image_tiny/io_denoise.safetensors. That mode needs nothing beyond the
Python standard library; pipelines/restyle.sh uses it to run with the tiny test pipeline.
"""
import argparse
import json
import struct
import sys


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} and the metadata of a safetensors file (stdlib only)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SystemExit(f"{path}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise SystemExit(f"{path}: header length {n} runs past the file end")
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, rec in header.items():
        b, e = rec["data_offsets"]
        out[name] = (rec["dtype"], rec["shape"], body[b:e])
    return out, meta


def write_safetensors(path, tensors, metadata):
    """tensors: {name: (dtype, shape, bytes)}; header sorted, 8-byte aligned."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def from_fixture(args):
    tensors, meta = read_safetensors(args.from_fixture)
    pre = f"{args.case}." if args.case else ""

    def take(name, out_path):
        if pre + name not in tensors:
            raise SystemExit(f"{args.from_fixture} has no tensor '{pre}{name}'")
        out = {"prompt_embeds": tensors[pre + name]}
        if pre + name + "_mask" in tensors:
            out["prompt_embeds_mask"] = tensors[pre + name + "_mask"]
        write_safetensors(out_path, out, {"source": args.from_fixture, "case": args.case, "tensor": name,
                                          "diffusers_version": meta.get("diffusers_version", "")})
        print(f"wrote {out_path} ({name} {out['prompt_embeds'][1]})")

    take("prompt_embeds", args.out)
    if args.negative_out:
        take("negative_prompt_embeds", args.negative_out)


def from_model(args):
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    import diffusers
    from safetensors.torch import save_file

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    device = torch.device(args.device)
    text_encoder = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        args.model, subfolder="text_encoder", torch_dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model, subfolder="tokenizer")
    with torch.no_grad():
        if args.pipeline == "qwen-image":
            pipe = diffusers.QwenImagePipeline(scheduler=None, vae=None, text_encoder=text_encoder,
                                               tokenizer=tokenizer, transformer=None)
            embeds, mask = pipe.encode_prompt(args.prompt, device=device,
                                              max_sequence_length=args.max_sequence_length)
        else:
            from PIL import Image
            from transformers import Qwen2VLProcessor
            from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
                CONDITION_IMAGE_SIZE, calculate_dimensions)

            if not args.image:
                raise SystemExit("--pipeline edit-plus needs --image (the reference frame)")
            try:
                processor = Qwen2VLProcessor.from_pretrained(args.model, subfolder="processor")
            except ImportError as e:  # transformers' video processor needs torchvision
                raise SystemExit(f"--pipeline edit-plus cannot load the Qwen2-VL processor: "
                                 f"{str(e).strip().splitlines()[0]}")
            pipe = diffusers.QwenImageEditPlusPipeline(scheduler=None, vae=None, text_encoder=text_encoder,
                                                       tokenizer=tokenizer, processor=processor,
                                                       transformer=None)
            # As QwenImageEditPlusPipeline.__call__ prepares its condition images.
            images = []
            for p in args.image:
                img = Image.open(p).convert("RGB")
                w, h = calculate_dimensions(CONDITION_IMAGE_SIZE, img.size[0] / img.size[1])
                images.append(pipe.image_processor.resize(img, h, w))
            embeds, mask = pipe.encode_prompt(args.prompt, image=images, device=device,
                                              max_sequence_length=args.max_sequence_length)
    if mask is None:  # encode_prompt drops an all-ones mask; keep it explicit in the file
        mask = torch.ones(embeds.shape[:2], dtype=torch.long)
    save_file({"prompt_embeds": embeds.to(dtype).contiguous().cpu(),
               "prompt_embeds_mask": mask.to(torch.float32).contiguous().cpu()},
              args.out,
              metadata={"prompt": args.prompt, "model": args.model, "pipeline": args.pipeline,
                        "diffusers_version": diffusers.__version__, "torch_version": torch.__version__})
    print(f"wrote {args.out}: prompt_embeds {list(embeds.shape)}, {int(mask.sum())} valid tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output .safetensors")
    ap.add_argument("--model", help="pipeline root with text_encoder/ and tokenizer/ (processor/ for edit-plus)")
    ap.add_argument("--prompt", help="the prompt text")
    ap.add_argument("--pipeline", choices=["qwen-image", "edit-plus"], default="qwen-image",
                    help="whose encode_prompt to run (edit-plus: QwenImageEditPlusPipeline, with --image)")
    ap.add_argument("--image", action="append", help="edit-plus: reference image(s)")
    ap.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32",
                    help="text encoder dtype and the stored embeddings' dtype (the pipelines use bf16)")
    ap.add_argument("--device", default="cpu", help="torch device for the text encoder")
    ap.add_argument("--max-sequence-length", type=int, default=1024)
    ap.add_argument("--from-fixture", help="copy embeddings from a DiT fixture file instead")
    ap.add_argument("--case", default="", help="--from-fixture: the case prefix (e.g. t2i_cfg)")
    ap.add_argument("--negative-out", help="--from-fixture: also write the negative embeddings here")
    args = ap.parse_args()
    if args.from_fixture:
        from_fixture(args)
    elif args.model and args.prompt is not None:
        from_model(args)
    else:
        ap.error("give --model and --prompt, or --from-fixture")


if __name__ == "__main__":
    sys.exit(main())
