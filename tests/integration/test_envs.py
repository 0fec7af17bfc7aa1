"""Env layer on real emulators (ale-py and EnvPool): shapes, ids, seeding, reported returns."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from distppo.core.seeds import env_seed, seed_everything
from distppo.envs.atari_gym import make_atari_gym_env
from distppo.envs.factory import make_vector_env
from distppo.envs.games import ATARI_57, resolve_env_id, to_gym, to_v5
from distppo.errors import ConfigError

from helpers import video_codec

BACKENDS = ("gym", "envpool", "ale")
VIDEO_BACKENDS = ("gym", "envpool")  # ale-py's vector env renders no frames
BREAKOUT_LIVES = 5  # a test-side game fact: one training-level done per life


def _make(env_id="Breakout-v5", backend="gym", num_envs=2, seed=1, frame_stack=4, **kw):
    return make_vector_env(env_id, backend, num_envs, seed, frame_stack, **kw)


@pytest.mark.parametrize("game", ["Breakout-v5", "Pong-v5"])
def test_backends_agree_on_shapes_and_actions(game):
    for frame_stack in (4, 1):
        found = set()
        for backend in BACKENDS:
            venv = _make(game, backend, frame_stack=frame_stack)
            obs = venv.reset()
            step = venv.step(np.zeros(2, dtype=np.int64))
            assert obs.shape == step.obs.shape == (2, frame_stack, 84, 84)
            assert obs.dtype == step.obs.dtype == venv.obs_dtype == np.uint8
            assert step.reward.dtype == np.float32 and step.done.dtype == bool
            found.add((venv.obs_shape, venv.num_actions))
            venv.close()
        assert found == {((frame_stack, 84, 84), 4 if game == "Breakout-v5" else 6)}


@pytest.mark.slow
def test_every_game_builds_and_steps_on_every_backend():
    """All 57 games x 3 backends, both id forms: one env each, a few random steps; the
    backends agree on each game's minimal action set."""
    rng = np.random.default_rng(0)
    for v5 in ATARI_57:
        actions = set()
        for backend, env_id in zip(BACKENDS, (to_gym(v5), v5, v5)):
            venv = _make(env_id, backend, num_envs=1, frame_stack=1)
            try:
                assert venv.reset().shape == (1, 1, 84, 84), (v5, backend)
                for _ in range(3):
                    step = venv.step(rng.integers(venv.num_actions, size=1))
                    assert step.obs.shape == (1, 1, 84, 84), (v5, backend)
                actions.add(venv.num_actions)
            finally:
                venv.close()
        assert len(actions) == 1, (v5, actions)


def test_gym_builds_a_v4_id_ale_py_lacks_as_the_v4_id():
    """ale-py 0.12 registers no SurroundNoFrameskip-v4; the gym backend builds the game from
    ALE/Surround-v5 with the v4 kwargs. Equal to a v4 registration made the way ale-py makes
    the others (Breakout's spec with the ROM swapped): spec fields, actions and frames."""
    import ale_py
    import gymnasium as gym

    from distppo.envs.atari_gym import v4_or_v5_id
    gym.register_envs(ale_py)
    assert "SurroundNoFrameskip-v4" not in gym.registry  # else this test tests nothing
    assert v4_or_v5_id("SurroundNoFrameskip-v4") == "ALE/Surround-v5"
    assert v4_or_v5_id("BreakoutNoFrameskip-v4") == "BreakoutNoFrameskip-v4"
    v4 = gym.registry["BreakoutNoFrameskip-v4"]
    kwargs = dict(frameskip=1, repeat_action_probability=0.0, full_action_space=False,
                  max_num_frames_per_episode=108_000)
    assert {k: v for k, v in v4.kwargs.items() if k != "game"} == kwargs
    ours = gym.make("ALE/Surround-v5", **kwargs)
    gym.register("TestSurroundNoFrameskip-v4", entry_point=v4.entry_point,
                 kwargs=dict(v4.kwargs, game="surround"), max_episode_steps=v4.max_episode_steps,
                 nondeterministic=v4.nondeterministic, order_enforce=v4.order_enforce)
    try:
        ref = gym.make("TestSurroundNoFrameskip-v4")
        for field in ("max_episode_steps", "nondeterministic", "order_enforce",
                      "disable_env_checker", "additional_wrappers"):
            assert getattr(ours.spec, field) == getattr(ref.spec, field), field
        assert ours.unwrapped.get_action_meanings() == ref.unwrapped.get_action_meanings()
        rng = np.random.default_rng(0)
        for a, b in zip(ours.reset(seed=5), ref.reset(seed=5)):
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        for _ in range(200):
            action = int(rng.integers(ours.action_space.n))
            got, want = ours.step(action), ref.step(action)
            assert np.array_equal(got[0], want[0]) and got[1:4] == want[1:4]
        ours.close()
        ref.close()
    finally:
        del gym.registry["TestSurroundNoFrameskip-v4"]


def test_id_forms_map_on_both_backends():
    assert len(ATARI_57) == len(set(ATARI_57)) == 57
    for v5 in ATARI_57:
        assert to_v5(to_gym(v5)) == v5 and to_gym(v5).endswith("NoFrameskip-v4")
    for env_id in ("Breakout-v5", "BreakoutNoFrameskip-v4"):
        assert resolve_env_id(env_id, "gym").backend_id == "BreakoutNoFrameskip-v4"
        assert resolve_env_id(env_id, "envpool").backend_id == "Breakout-v5"
        assert resolve_env_id(env_id, "ale").backend_id == "ALE/Breakout-v5"
        for backend in BACKENDS:
            venv = _make(env_id, backend, num_envs=1)
            assert venv.reset().shape == (1, 4, 84, 84)
            venv.close()


def test_unknown_id_names_closest_ids():
    for backend in BACKENDS:
        with pytest.raises(ConfigError) as err:
            _make("Breakuot-v5", backend)
        msg = str(err.value)
        assert "\n" not in msg and "'Breakuot-v5'" in msg
        assert "Breakout-v5" in msg and "BreakoutNoFrameskip-v4" in msg
    with pytest.raises(ConfigError, match="CartPole-v1"):
        resolve_env_id("CartPol-v1", "gym")


def test_classic_envs():
    for backend in ("envpool", "ale"):
        with pytest.raises(ConfigError, match="--backend gym"):
            _make("CartPole-v1", backend)
    novel, full = _make("CartPoleNoVel-v1", "gym"), _make("CartPole-v1", "gym")
    assert novel.obs_shape == (2,) and novel.obs_dtype == np.float32
    assert full.obs_shape == (4,) and novel.num_actions == full.num_actions == 2
    # Same seeds, same actions: NoVel sees exactly CartPole's positions x and theta.
    obs_n, obs_f = novel.reset(), full.reset()
    lengths = []
    for t in range(300):
        np.testing.assert_array_equal(obs_n, obs_f[:, [0, 2]])
        actions = np.array([t % 2, (t // 3) % 2])
        step_n, step_f = novel.step(actions), full.step(actions)
        obs_n, obs_f = step_n.obs, step_f.obs
        np.testing.assert_array_equal(step_n.done, step_f.done)
        for ep in step_f.episodes:  # reward 1 per step: the return is the length
            assert step_f.done[ep.env_index] and ep.ret == ep.length
            lengths.append(ep.length)
    assert lengths, "no CartPole episode ended in 300 steps"
    novel.close(), full.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_reported_return_spans_all_lives(backend):
    """A life loss is a training done but not a reported game; the game's return is raw."""
    venv = _make("Breakout-v5", backend, num_envs=2, seed=3)
    venv.reset()
    rng = np.random.default_rng(0)
    raw_sum, steps, dones = np.zeros(2), np.zeros(2, dtype=int), np.zeros(2, dtype=int)
    games, life_losses = [], 0
    while not any(ret > 0 for ret, _ in games) or len(games) < 2:
        assert sum(steps) < 20_000, "no scoring Breakout game in 20k steps"
        result = venv.step(rng.integers(0, venv.num_actions, size=2))
        raw_sum += venv.raw_reward   # envpool: info["reward"]; gym: the innermost wrapper
        steps += 1
        dones += result.done
        # Training reward is the sign of the raw one (EnvPool's reset step is raw 0 too).
        np.testing.assert_array_equal(result.reward, np.sign(venv.raw_reward))
        ended = {ep.env_index: ep for ep in result.episodes}
        for i in np.flatnonzero(result.done):
            if i not in ended:
                life_losses += 1   # done with lives left: the game goes on
        for i, ep in ended.items():
            assert result.done[i], "a game can only end at a training-level done"
            assert ep.ret == pytest.approx(raw_sum[i]) and ep.length == steps[i]
            assert dones[i] == BREAKOUT_LIVES
            games.append((ep.ret, ep.length))
            raw_sum[i], steps[i], dones[i] = 0.0, 0, 0
    assert life_losses >= (BREAKOUT_LIVES - 1) * len(games)
    venv.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeding(backend):
    def rollout(seed):
        venv = _make("Breakout-v5", backend, num_envs=2, seed=seed)
        obs = [venv.reset()] + [venv.step(np.array([t % 4, 3 - t % 4])).obs for t in range(20)]
        venv.close()
        return np.stack(obs)   # [T, N, 4, 84, 84]

    a, b, c = rollout(1), rollout(1), rollout(2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[0], c[0])
    # sub-env i gets seed + i: env 1 of seed 1 is env 0 of seed 2 (reset obs; actions differ).
    np.testing.assert_array_equal(a[0, 1], c[0, 0])


def test_seed_helpers():
    assert [env_seed(10, r, 8) for r in range(3)] == [10, 18, 26]
    # a rebuilt runner (incarnation k) takes a block no env of the run used: 3 runners x 2
    # envs, restarts 0..2 of every runner cover seeds 10..27 exactly once
    seeds = [env_seed(10, r, 2, num_runners=3, incarnation=k) + i
             for k in range(3) for r in range(3) for i in range(2)]
    assert sorted(seeds) == list(range(10, 28))
    assert env_seed(10, 1, 2, num_runners=3, incarnation=0) == env_seed(10, 1, 2)
    seed_everything(7)
    first = (np.random.rand(), torch.rand(1).item())
    seed_everything(7)
    assert (np.random.rand(), torch.rand(1).item()) == first


def _spy_actions(stats):
    """Record every emulator-frame action reaching the innermost wrapper."""
    actions, inner_step = [], stats.step

    def step(action):
        actions.append(int(action))
        return inner_step(action)

    stats.step = step
    return actions


def test_gym_chain_noops_fire_and_skip():
    from stable_baselines3.common.atari_wrappers import FireResetEnv as FireReset
    env, stats = make_atari_gym_env("BreakoutNoFrameskip-v4", frame_stack=4)
    assert any(isinstance(w, FireReset) for w in _wrappers(env))
    frames = _spy_actions(stats)
    noop_counts = set()
    for seed in range(6):
        frames.clear()
        env.reset(seed=seed)
        noops = len(frames) - 8
        assert 1 <= noops <= 30 and frames == [0] * noops + [1] * 4 + [2] * 4
        noop_counts.add(noops)
    assert len(noop_counts) > 1, "the number of no-ops should depend on the seed"
    # One agent step = 4 emulator frames of the same action.
    frames.clear()
    obs, *_ = env.step(3)
    assert frames == [3] * 4 and obs.shape == (4, 84, 84)
    # A life loss: EpisodicLife's NOOP agent step, then FIRE and 2, within the same game.
    while True:
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            break
    lives = env.unwrapped.ale.lives()
    assert 0 < lives < BREAKOUT_LIVES
    frames.clear()
    env.reset()
    assert frames == [0] * 4 + [1] * 4 + [2] * 4 and env.unwrapped.ale.lives() == lives
    env.close()
    # Pong wants FIRE too; Freeway (NOOP, UP, DOWN) has no FIRE and gets no FireReset.
    freeway, _ = make_atari_gym_env("FreewayNoFrameskip-v4", frame_stack=1)
    assert not any(isinstance(w, FireReset) for w in _wrappers(freeway))
    freeway.close()


def test_gym_vector_resets_in_the_same_step():
    """The vector env equals one chain reset by hand right after each done (SyncVectorEnv 0.29)."""
    venv = _make("Breakout-v5", "gym", num_envs=1, seed=5)
    env, _ = make_atari_gym_env("BreakoutNoFrameskip-v4", frame_stack=4)
    np.testing.assert_array_equal(venv.reset()[0], env.reset(seed=5)[0])
    actions, dones = np.random.default_rng(1).integers(0, 4, size=300), 0
    for a in actions:
        result = venv.step(np.array([a]))
        obs, reward, terminated, truncated, _ = env.step(int(a))
        if terminated or truncated:
            obs, _ = env.reset()
            dones += 1
        np.testing.assert_array_equal(result.obs[0], obs)
        assert result.reward[0] == reward and result.done[0] == (terminated or truncated)
    assert dones >= 2, "the comparison should cross a few life losses"
    venv.close(), env.close()


def test_gym_clip_reward_is_sign():
    from stable_baselines3.common.atari_wrappers import ClipRewardEnv as ClipReward
    env, _ = make_atari_gym_env("BreakoutNoFrameskip-v4", frame_stack=1)
    clip = next(w for w in _wrappers(env) if isinstance(w, ClipReward))
    assert [clip.reward(r) for r in (-3.5, 0.0, 0.25, 7.0)] == [-1.0, 0.0, 1.0, 1.0]
    env.close()


def _wrappers(env):
    while hasattr(env, "env"):
        yield env
        env = env.env


@pytest.mark.parametrize("backend", VIDEO_BACKENDS)
def test_video_of_env0_games(backend, tmp_path):
    venv = _make("Breakout-v5", backend, num_envs=2, seed=1, video_dir=str(tmp_path))
    venv.reset()
    game_length, extra_steps = None, 0
    while extra_steps < 10:   # finish env 0's first game, then cut the second one short
        result = venv.step(np.array([0, 0]))  # NOOP: Breakout's ball drops, lives go fast
        if game_length is not None:
            extra_steps += 1
        for ep in result.episodes:
            if ep.env_index == 0 and game_length is None:
                game_length = ep.length
    venv.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episode-0.mp4", "episode-1.mp4"]
    cap = cv2.VideoCapture(str(tmp_path / "episode-0.mp4"))
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    # One frame per agent step (plus the reset frames), at the emulator's resolution.
    assert game_length <= len(frames) <= game_length + BREAKOUT_LIVES
    assert frames[0].shape == (210, 160, 3)
    assert np.std(np.stack(frames).astype(np.float32)) > 10, "video frames look blank"
    # H.264, which browsers and W&B play (OpenCV's mp4v is MPEG-4 Part 2: they do not)
    for name in ("episode-0.mp4", "episode-1.mp4"):
        assert video_codec(tmp_path / name) == ("avc1", "h264")


def test_time_limit_in_agent_steps_on_both_backends():
    """--max-episode-steps counts agent steps: EnvPool cuts the game at exactly N steps, the
    gym chain at 4N emulator frames, the reset no-ops and FIRE steps included (so a little
    earlier). Pong with NOOPs outlives 100 steps, so only the limit ends its games."""
    from distppo.envs.factory import DEFAULT_MAX_EPISODE_STEPS, episode_limit
    assert episode_limit("Breakout-v5", "envpool") == 108_000   # EnvPool 0.6.6, CleanRL's
    assert episode_limit("Breakout-v5", "gym") == 27_000        # 108,000 frames
    assert episode_limit("CartPole-v1", "gym") is None
    assert episode_limit("Pong-v5", "envpool", 500) == 500
    venv = _make("Pong-v5", "envpool", num_envs=1, frame_stack=1)
    assert venv.env.spec.config.max_episode_steps == DEFAULT_MAX_EPISODE_STEPS["envpool"]
    venv.close()
    for backend in BACKENDS:
        venv = _make("Pong-v5", backend, num_envs=2, frame_stack=1, max_episode_steps=100)
        venv.reset()
        lengths = []
        for _ in range(250):
            result = venv.step(np.zeros(2, dtype=np.int64))
            for ep in result.episodes:
                assert result.done[ep.env_index]
                lengths.append(ep.length)
        venv.close()
        assert len(lengths) >= 4, (backend, lengths)
        if backend == "envpool":   # later games count EnvPool's reset step too
            assert lengths[:2] == [100, 100] and set(lengths[2:]) == {101}, lengths
        else:                      # <= 30 no-op frames + 2 FIRE-reset steps come off the limit
            assert all(100 - 10 <= n <= 100 for n in lengths), lengths


def _cleanrl_gym_envs(gym_id: str, num_envs: int, frame_stack: int):
    """ppo_atari.py's make_env as CleanRL wrote it (gymnasium 0.29.1, SB3's wrappers), here
    on gymnasium 1.x: RecordEpisodeStatistics, SB3's chain, resize, grey with cv2 (0.29's
    GrayScaleObservation), frame stack, in a same-step SyncVectorEnv."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import (
        ClipRewardEnv,
        EpisodicLifeEnv,
        FireResetEnv,
        MaxAndSkipEnv,
        NoopResetEnv,
    )
    gym.register_envs(ale_py)

    def thunk():
        env = gym.make(gym_id, frameskip=1, repeat_action_probability=0.0,
                       full_action_space=False, max_num_frames_per_episode=108_000)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = NoopResetEnv(env, noop_max=30)
        env = MaxAndSkipEnv(env, skip=4)
        env = EpisodicLifeEnv(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireResetEnv(env)
        env = ClipRewardEnv(env)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
        env = gym.wrappers.TransformObservation(
            env, lambda o: cv2.cvtColor(o, cv2.COLOR_RGB2GRAY),
            gym.spaces.Box(0, 255, (84, 84), np.uint8))
        return gym.wrappers.FrameStackObservation(env, frame_stack)

    return gym.vector.SyncVectorEnv([thunk] * num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def test_gym_backend_equals_cleanrl_chain_on_sb3_wrappers():
    """Same seeds, same random actions for 2 x 1,000 agent steps of Breakout through our gym
    backend and through CleanRL's make_env: equal observations, training rewards, dones and
    reported game returns, across many life losses and several game overs."""
    num_envs, steps, seed = 2, 1_000, 7
    ours = _make("BreakoutNoFrameskip-v4", "gym", num_envs=num_envs, seed=seed)
    ref = _cleanrl_gym_envs("BreakoutNoFrameskip-v4", num_envs, frame_stack=4)
    ref_obs, _ = ref.reset(seed=seed)
    np.testing.assert_array_equal(ours.reset(), ref_obs)
    actions = np.random.default_rng(seed).integers(0, 4, size=(steps, num_envs))
    dones = games = 0
    for t, action in enumerate(actions):
        result = ours.step(action)
        ref_obs, ref_reward, terminated, truncated, info = ref.step(action)
        np.testing.assert_array_equal(result.obs, ref_obs, err_msg=f"step {t}")
        np.testing.assert_array_equal(result.reward, ref_reward.astype(np.float32))
        np.testing.assert_array_equal(result.done, terminated | truncated)
        final = info.get("final_info", {})
        ref_games = sorted((i, float(final["episode"]["r"][i]))
                           for i in np.flatnonzero(final.get("_episode", [])))
        assert sorted((ep.env_index, ep.ret) for ep in result.episodes) == ref_games, t
        dones += int(result.done.sum())
        games += len(result.episodes)
    ours.close(), ref.close()
    assert games >= 6 and dones >= (BREAKOUT_LIVES - 1) * games, (games, dones)


def test_envpool_logs_games_as_ppo_atari_envpool_does():
    """envpool_logged equals ppo_atari_envpool.py's RecordEpisodeStatistics and logging rule
    replayed on a twin EnvPool (same seed, same actions). A short time limit makes Breakout
    games end with lives left: those are ours but not CleanRL's, and their score runs on."""
    import envpool
    seed, limit, num_envs = 2, 150, 2
    ours = _make("Breakout-v5", "envpool", num_envs=num_envs, seed=seed, frame_stack=1,
                 max_episode_steps=limit)
    twin = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=num_envs,
                        episodic_life=True, reward_clip=True, seed=seed, stack_num=1,
                        max_episode_steps=limit)
    ours.reset(), twin.reset()
    episode_returns = np.zeros(num_envs, dtype=np.float32)   # the script's wrapper state
    actions = np.random.default_rng(seed).integers(0, 4, size=(1_500, num_envs))
    logged, games, cut_with_lives = [], [], 0
    for action in actions:
        result = ours.step(action)
        _, _, terminated, truncated, info = twin.step(action.astype(np.int32))
        next_done = terminated | truncated
        episode_returns += info["reward"]
        returned = episode_returns.copy()
        episode_returns *= 1 - info["terminated"]
        expected = [(idx, float(returned[idx])) for idx, d in enumerate(next_done)
                    if d and info["lives"][idx] == 0]
        assert result.envpool_logged == expected
        logged += [r for _, r in expected]
        games += [ep.ret for ep in result.episodes]
        cut_with_lives += int((truncated & (info["lives"] > 0)).sum())
    ours.close(), twin.close()
    assert cut_with_lives >= 2 and len(logged) >= 2, (cut_with_lives, logged)
    assert len(games) > len(logged)   # games cut by the limit: ours, not the script's


def test_ale_backend_sees_the_gym_chains_frames():
    """Same emulator, same frames: ale-py's vector env against the gym chain's MaxAndSkipEnv +
    resize + grey + frame stack driven by hand through the frames of ale-py's reset (one FIRE
    agent step, then the noops; the gym chain does noops, FIRE, 2). Equal up to +-1 grey level
    at a few pixels (C++ converts to grey before the resize, CleanRL after), same raw rewards,
    until the first life loss, where the gym chain would press NOOP, FIRE, 2 and ale-py not."""
    from collections import deque

    import ale_py
    import cv2
    import gymnasium as gym
    from stable_baselines3.common.atari_wrappers import MaxAndSkipEnv

    from distppo.envs.atari_gym import grey

    gym.register_envs(ale_py)

    def prep(frame):  # gymnasium's ResizeObservation (INTER_AREA), then grey as CleanRL
        return grey(cv2.resize(frame, (84, 84), interpolation=cv2.INTER_AREA))

    def close(ours, theirs):
        diff = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))  # [k, 84, 84]
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (diff.max(), (diff > 0).mean())

    for seed in (1, 2):
        venv = _make("Breakout-v5", "ale", num_envs=1, seed=seed)
        obs = venv.reset()
        noops = int(venv.episode_frames[0]) - 4   # after FIRE for one agent step of 4 frames
        assert 1 <= noops <= 30
        raw = gym.make("BreakoutNoFrameskip-v4", frameskip=1, repeat_action_probability=0.0,
                       full_action_space=False, max_num_frames_per_episode=108_000)
        skip = MaxAndSkipEnv(raw, skip=4)
        raw.reset(seed=seed)
        frames = [raw.step(a)[0] for a in [1] * 4 + [0] * noops]
        # the reset frame is not max-pooled; a reset fills the stack with it
        stack = deque([prep(frames[-1])] * 4, maxlen=4)
        close(obs[0], np.stack(stack))
        for t, a in enumerate(np.random.default_rng(seed).integers(0, 4, size=300)):
            result = venv.step(np.array([a]))
            frame, reward, *_ = skip.step(int(a))
            stack.append(prep(frame))
            if result.done[0]:
                assert 0 < raw.unwrapped.ale.lives() < BREAKOUT_LIVES and t > 5
                break
            assert venv.raw_reward[0] == reward and result.reward[0] == np.sign(reward)
            close(result.obs[0], np.stack(stack))
        else:
            raise AssertionError("no life lost in 300 random Breakout steps")
        venv.close(), raw.close()


def test_ale_stack_refills_at_every_done_and_video_is_refused(tmp_path):
    venv = _make("Breakout-v5", "ale", num_envs=2, seed=1)
    obs = venv.reset()
    assert all(np.array_equal(obs[i, 0], obs[i, j]) for i in range(2) for j in range(4))
    rng = np.random.default_rng(0)
    for _ in range(5_000):
        # random actions: with NOOP alone Breakout never serves again after a life loss
        # (ale-py presses no FIRE then, docs/semantics.md)
        result = venv.step(rng.integers(0, 4, size=2))
        for i in np.flatnonzero(result.done):  # FrameStack.reset: k copies of the newest frame
            assert all(np.array_equal(result.obs[i, 0], result.obs[i, j]) for j in range(4))
        if result.episodes:
            break
    assert result.episodes, "no Breakout game over in 5000 random steps"
    venv.close()
    with pytest.raises(ConfigError, match="--backend envpool or gym"):
        _make("Breakout-v5", "ale", video_dir=str(tmp_path))
