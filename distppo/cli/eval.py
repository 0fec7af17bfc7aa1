"""`distppo eval`: play a run's latest checkpoint and print its mean raw game score."""
from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="play a run's latest checkpoint and print its return")
    p.add_argument("run_dir", help="the run folder (holds config.json and checkpoints/)")
    p.add_argument("--episodes", type=int, default=10, help="full games to play (default: 10)")
    p.add_argument("--greedy", action="store_true", help="argmax actions instead of sampling")
    p.add_argument("--video", action="store_true",
                   help="write an MP4 of the first game to RUN_DIR/videos")
    p.add_argument("--seed", type=int, default=None,
                   help="env seed (default: the run's seed + 10000)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from distppo.core.evaluate import evaluate
    result = evaluate(args.run_dir, episodes=args.episodes, greedy=args.greedy, video=args.video,
                      seed=args.seed)
    print(f"episodes: {result['episodes']}  return mean: {result['mean']:.2f}  "
          f"std: {result['std']:.2f}")
    if result.get("video"):
        print(f"video: {result['video']}")
    return 0
