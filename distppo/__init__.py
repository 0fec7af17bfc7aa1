"""distppo: PPO and PPO-LSTM on Atari with CleanRL's learning behaviour, distributed over Ray."""
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("distppo")
except _metadata.PackageNotFoundError:  # a source tree that was not pip-installed
    __version__ = "0+unknown"
