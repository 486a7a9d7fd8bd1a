"""Plain helpers shared by the test folders (imported as `tests.helpers`); fixtures live in conftest.py."""


def write_random(path, size, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(data)
    return data


def model_and_drives(tmp_path, size, seed):
    """A random 'model' on an 'internal' folder and two empty destination folders (green, white):
    returns (source path, its bytes, [destination dirs])."""
    src = tmp_path / "internal" / "model.gguf"
    src.parent.mkdir()
    data = write_random(src, size, seed=seed)
    dests = [tmp_path / "green", tmp_path / "white"]
    for d in dests:
        d.mkdir()
    return src, data, dests
