"""Vector envs: EnvPool, gymnasium + ale-py, classic control, behind one VecEnv protocol."""
