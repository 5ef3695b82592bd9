"""scripts/ncu_roles.py: the stall samples of a warp-specialized kernel split by role, on a made-up SASS page
laid out as ptxas lays out a Gluon kernel (set-up, then one stretch per partition opened by USETMAXREG, EXIT,
then the out-of-line mbarrier wait loops), and on the kept H200 pages."""
import csv
from pathlib import Path

import pytest

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb", "stall_wait",
          "stall_long_sb (Not Issued)"]
# (source, samples); addresses are 0x100 + 0x10 * index
SASS = [
    ("S2R R0, SR_TID.X", 1),
    ("@!P0  BRA 0x1a0", 1),                        # to the loader's stretch
    ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xa0", 1),  # consumer: index 2
    ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], RZ, !UPT", 5),
    ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 20),
    ("MUFU.EX2 R23, R23", 30),
    ("FMNMX R1, R2, R3, !PT", 10),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x100], R19", 2),
    ("@!P0  BRA 0x200", 0),                         # fails into the first wait loop (index 16)
    ("USETMAXREG.DEALLOC.CTAPOOL 0x20", 1),         # loader: index 9
    ("@UP0  UTMALDG.3D [UR24], [UR22]", 3),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR21+0x108], R14", 4),
    ("@!P2  BRA 0x220", 40),                        # the loader waiting for a free slot
    ("LDS R4, [R2]", 6),
    ("BAR.SYNC.DEFER_BLOCKING 0x1", 2),
    ("EXIT", 1),                                    # index 15
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x100], R19", 7),   # 0x200: consumer's wait loop
    ("BRA 0x180", 0),
    ("SYNCS.PHASECHK.TRANS64.TRYWAIT P2, [UR21+0x108], R14", 9),  # 0x220: loader's wait loop
    ("BRA 0x1c0", 0),
]


@pytest.fixture(scope="module")
def roles_script(load_script):
    return load_script("ncu_roles")


@pytest.fixture
def page(tmp_path):
    path = tmp_path / "ncu_sass_fake.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "fake_kernel"])
        w.writerow(HEADER)
        for i, (source, samples) in enumerate(SASS):
            w.writerow([hex(0x100 + 0x10 * i), source, samples, samples / 2, samples / 2, 0])
    return str(path)


def test_each_stretch_gets_its_role_and_the_wait_loops_their_callers(roles_script, page):
    rows, reasons = roles_script.read(page)
    assert reasons == ["stall_long_sb", "stall_wait"]
    role = roles_script.roles(rows)
    assert role[:2] == ["set-up"] * 2
    assert role[2:9] == ["consumer 1"] * 7
    assert role[9:16] == ["loader"] * 7
    assert role[16:18] == ["consumer 1"] * 2 and role[18:20] == ["loader"] * 2


def test_samples_are_classed_by_what_the_warps_wait_on(roles_script, page):
    rows, _ = roles_script.read(page)
    loops = {0x200, 0x220}
    kinds = [roles_script.instruction_class(r["source"], loops) for r in rows]
    assert kinds[3:9] == ["wgmma issue", "wgmma wait", "MUFU", "other", "mbarrier wait", "mbarrier wait"]
    assert kinds[12:15] == ["mbarrier wait", "memory", "named barrier"]
    assert kinds[1] == "other"  # a branch that is no failed poll
    text = roles_script.table(page)
    consumer = next(line for line in text.splitlines() if line.startswith("| consumer 1 |"))
    # consumer: 5 + 20 + 30 + 10 + 2 + 0 + 1 (USETMAXREG) + the wait loop's 7 = 75 samples; MUFU 30 of them
    assert consumer.split(" | ")[1] == "52.4%" and consumer.split(" | ")[2:5] == ["27%", "7%", "12%"]
    loader = next(line for line in text.splitlines() if line.startswith("| loader |"))
    assert loader.split(" | ")[4] == "80%"  # 4 + 40 + 9 of its 66 samples wait on mbarriers


@pytest.mark.parametrize("kernel", ["fwd", "dkdv", "dq"])
def test_the_kept_h200_pages_read_with_one_loader_and_consumers_that_rarely_wait_for_it(roles_script, kernel):
    pages = [str(p) for p in (Path(__file__).resolve().parents[2] / "docs" / "bench").glob(
        f"ncu_sass_*_h200/ncu_sass_{kernel}.csv.xz")]
    if not pages:
        pytest.skip("no kept page")
    text = roles_script.table(sorted(pages)[-1])
    lines = [line for line in text.splitlines() if line.startswith("| consumer") or line.startswith("| loader")]
    assert sum(line.startswith("| loader") for line in lines) == 1 and len(lines) >= 3
    for line in lines:
        if line.startswith("| consumer"):
            assert float(line.split(" | ")[4].rstrip("%")) < 10  # mbarrier waits: the loader keeps up
