"""kompress.Stash from Python: round trips within the bound, the entry's info, and each budget
policy as in C++ (docs/stash.md)."""
import numpy as np
import torch

import kompress
from conftest import assert_within, load


def test_save_restore_within_the_bound():
    stash = kompress.Stash(16 << 20)
    x = load("act_mlp_relu2_out_1024x1024.f32")
    h = stash.save(x, rel=1e-2)
    info = stash.info(h)
    assert info.count == x.size and info.dtype == "float32" and info.ratio > 2 and h in stash
    out = torch.empty(1024, 1024)
    stash.restore(h, out)
    assert_within(x, out.numpy(), info.absolute_bound)
    y = stash.restore(h, drop=True)
    assert_within(x, y, info.absolute_bound)
    assert h not in stash and stash.stats().entries == 0 and stash.stats().saves == 1


def test_budget_policies():
    x = load("act_cnn_s3_relu_out_128x64x8x8.f32")           # 2 MiB
    small = 1 << 20
    host = kompress.Stash(small, policy="spill_host")
    h = host.save(x, abs=1e-7)
    assert host.info(h).spilled_segments > 0
    assert_within(x, host.restore(h), host.info(h).absolute_bound)

    import tempfile
    with tempfile.TemporaryDirectory() as directory:
        spill = kompress.Stash(small, policy="spill_file", directory=directory)
        h = spill.save(x, abs=1e-7)
        assert spill.stats().file_spilled_bytes > 0
        assert_within(x, spill.restore(h), spill.info(h).absolute_bound)
        spill.close()

    loosen = kompress.Stash(small, policy="loosen_bound", ceiling_rel=1e-1)
    h = loosen.save(x, rel=1e-6)
    info = loosen.info(h)
    assert info.loosened and info.used_bound > 1e-6 and loosen.stats().loosened_saves == 1
    assert_within(x, loosen.restore(h), info.absolute_bound)
