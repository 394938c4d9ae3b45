"""The flags of the commands that run or judge the model: verify-packing, train, profile, interleave and
compare (each ``_<name>_flags`` registers itself in :data:`lenbatch_study.cli.flag_table.FLAGS`). Apart
from :mod:`lenbatch_study.cli.flags` (the data and planning commands) because these carry the launcher's
and the kernels' options; :mod:`lenbatch_study.cli.flags` imports this module so that every command is
registered.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lenbatch_study.cli.params_args import (
    add_override,
    add_params_argument,
    params_from_args,
)
from lenbatch_study.pipeline.artifacts.train_runs import CHECKPOINT
from lenbatch_study.cli.flag_table import _flags_of, _kernel_backends, _stage


# --------------------------------------------------------------------------- verify-packing


@_flags_of("verify-packing")
def _verify_packing_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    parser.add_argument(
        "--model-config",
        default=None,
        metavar="FILE",
        help="YAML/JSON with a 'model' section, or a Hugging Face config.json of a "
        "Qwen3.5-architecture text model (default: the params' model section)",
    )
    parser.add_argument("--lengths", default="5,17,300,64", help="comma-separated sequence lengths (tokens)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--backend",
        default="auto",
        choices=_kernel_backends(),
        help="kernels under test: fla (flash-linear-attention; on CPU under Triton's interpreter, "
        "float32), torch (lenbatch's), auto (fla on CUDA in bfloat16 when installed). The "
        "reference is transformers' torch forward in every case",
    )
    parser.add_argument(
        "--dtype", default=None, choices=("float32", "bfloat16"), help="compute dtype (default: model.dtype)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    parser.add_argument(
        "--atol",
        type=float,
        default=None,
        help="largest allowed |difference| (default 1e-4 for float32; bfloat16 is judged by --rtol instead)",
    )
    parser.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="bfloat16 and --tf32 only: largest allowed |difference| / largest |reference value| "
        "per layer type (two kernels round differently; default 3e-2 for bfloat16, 3.75e-3 "
        "for --tf32)",
    )
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="float32 with TF32 dots in fla's kernels on a GPU (TRITON_F32_DEFAULT=tf32), judged by "
        "--rtol: compiles in about a quarter of the IEEE fp32 check's time",
    )
    parser.add_argument(
        "--no-boundaries",
        action="store_true",
        help="withhold the sequence boundaries on purpose (positions still restart): must fail",
    )
    parser.set_defaults(func=_verify_packing)


def _verify_packing(args: argparse.Namespace) -> int:
    return _stage("verify-packing").run(
        params=args.params,
        lengths=args.lengths,
        model_config=args.model_config,
        device=args.device,
        backend=args.backend,
        dtype=args.dtype,
        seed=args.seed,
        atol=args.atol,
        rtol=args.rtol,
        boundaries=not args.no_boundaries,
        tf32=args.tf32,
    )


# --------------------------------------------------------------------------- train, profile, compare


@_flags_of("train")
def _train_flags(parser: argparse.ArgumentParser) -> None:
    from lenbatch.batching.strategy import STRATEGIES

    add_params_argument(parser)
    parser.add_argument("--strategy", help=f"batching strategy (required): one of {', '.join(STRATEGIES)}")
    parser.add_argument("--data", default="results/tokenize", help="tokenize stage output (dataset/, lengths.npy)")
    parser.add_argument("--boundaries", default=None, help="boundaries.json (needed by the bucketed strategy)")
    parser.add_argument("--out", help="output directory (steps.jsonl, summary.json, checkpoint.pt; required)")
    add_override(parser, "train.useful_tokens")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="stop after this many global steps (total, counting steps before a resume)",
    )
    parser.add_argument("--resume", action="store_true", help=f"continue from OUT/{CHECKPOINT}")
    parser.add_argument(
        "--resume-if-interrupted",
        action="store_true",
        help="resume when an interrupted run of OUT left a checkpoint (in .OUT.partial beside OUT), "
        "else start afresh; under SLURM a run stopped by SIGUSR1 then requeues its job, to resume "
        "when started again (the train rule passes it)",
    )
    parser.add_argument("--launched", metavar="FILE", help=argparse.SUPPRESS)  # a worker: the launcher's request
    parser.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    """``lenbatch train``: reads and checks the request once, then trains in this process (one of torchrun's,
    or the only one: ``train.nodes x train.nproc`` = 1, outside a multi-node SLURM job), else launches the
    processes and hands them the checked request as it is (:mod:`lenbatch_study.runtime.launch`: torchrun here,
    or one per node under SLURM); a worker so started (``--launched FILE``) trains what it was handed."""
    from lenbatch.batching.strategy import STRATEGIES
    from lenbatch_study.runtime import launch
    from lenbatch_study.runtime.resume import partial_dir
    from lenbatch_study.runtime.runner import torchrun_world

    stage = _stage("train")
    if args.launched is not None:
        return stage.train(**launch.take_over(args.launched))
    if args.strategy is None or args.out is None:
        raise ValueError(
            "--strategy and --out are required; e.g. lenbatch train --strategy sorted --out results/train/sorted"
        )
    if args.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {args.strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if args.max_steps is not None and args.max_steps < 1:
        raise ValueError(f"--max-steps must be >= 1, got {args.max_steps}; give a positive step count or leave it out")
    params = params_from_args(args, "train.useful_tokens")
    out = Path(args.out)
    # decided once, here, for every process of the run: nothing writes the checkpoint before all have started
    resume = args.resume or (args.resume_if_interrupted and (partial_dir(out) / CHECKPOINT).exists())
    if resume:  # another train.nproc/nodes than the checkpoint's run: refused before torchrun starts
        from lenbatch_study.runtime.resume import check_resume_shape

        check_resume_shape(out, params, checkpoint=CHECKPOINT)
    request = {
        "params": params,
        "strategy": args.strategy,
        "data": args.data,
        "out": out,
        "boundaries": args.boundaries,
        "max_steps": args.max_steps,
        "resume": resume,
    }
    under_torchrun = torchrun_world()[0]
    if not under_torchrun and params.train.nodes * params.train.nproc > 1:
        from lenbatch_study.core.log import get_logger

        return launch.run_training(
            request,
            nproc=params.train.nproc,
            nodes=params.train.nodes,
            out=out,
            stopped=stage.stopped_on_signal,
            stopped_exit=stage.STOPPED_EXIT,
            requeue=args.resume_if_interrupted,
            log=get_logger("train").info,
        )
    rc = stage.train(**request)
    if args.resume_if_interrupted and not under_torchrun:  # the run's one process: it requeues its SLURM job
        rc = launch.requeue_if_stopped(rc, stage.stopped_on_signal(out) if rc else None)
    return rc


@_flags_of("profile")
def _profile_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    add_override(parser, "profile.repeats")
    parser.add_argument("--out", default="results/profile", help="output folder")
    parser.set_defaults(func=_profile)


def _profile(args: argparse.Namespace) -> int:
    return _stage("profile").run(params=params_from_args(args, "profile.repeats"), out=args.out)


@_flags_of("interleave")
def _interleave_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    parser.add_argument("--data", default="results/tokenize", help="tokenize stage output (dataset/, lengths.npy)")
    parser.add_argument(
        "--boundaries", default=None, help="boundaries.json (needed when train.strategies holds bucketed)"
    )
    parser.add_argument("--out", default="results/interleave", help="output folder")
    parser.set_defaults(
        func=lambda args: _stage("interleave").run(
            params=params_from_args(args), data=args.data, boundaries=args.boundaries, out=args.out
        )
    )


@_flags_of("compare")
def _compare_flags(parser: argparse.ArgumentParser) -> None:
    add_params_argument(parser)
    parser.add_argument("--stats", default="results/stats", help="stats stage output folder")
    parser.add_argument("--boundaries", default="results/boundaries", help="boundaries stage output folder")
    parser.add_argument("--plans", default="results/plans", help="plans stage output folder")
    parser.add_argument("--profile", default="results/profile", help="profile stage output folder")
    parser.add_argument("--train", default="results/train", help="folder of the train stage's <strategy>/ folders")
    parser.add_argument(
        "--data",
        default="results/tokenize",
        help="tokenize stage output the runs trained on: lengths.npy (to rebuild the planned "
        "batches) and dataset/ (loss masks: the drafter's exact anchors; estimated without it)",
    )
    parser.add_argument(
        "--quality",
        default="results/quality",
        help="quality stage output folder (quality.json); "
        "'' leaves the held-out loss out (a check that runs no quality stage)",
    )
    parser.add_argument(
        "--interleave",
        default="",
        help="interleave stage output folder (interleave.json): the "
        "ratios to sorted measured in turns (metrics.json's <strategy>.interleaved keys); '' (the "
        "default) leaves them out (a check that runs no interleave stage never reads another "
        "machine's)",
    )
    parser.add_argument("--out", default="results/compare", help="output folder")
    parser.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    return _stage("compare").run(
        params=params_from_args(args),
        stats=Path(args.stats),
        boundaries=Path(args.boundaries),
        plans=Path(args.plans),
        profile=Path(args.profile),
        train=Path(args.train),
        data=Path(args.data),
        quality=Path(args.quality) if args.quality else None,
        interleave=Path(args.interleave) if args.interleave else None,
        out=Path(args.out),
    )
