"""scripts/sass_blocks.py splits the consumers' tile loops into basic blocks (docs/bench/history.md's instruction counts
of the backward's loops come from it): checked on a hand-written SASS listing with an outer loop, an inner wgmma loop
holding a two-way branch, and a loop without wgmma."""


def test_innermost_wgmma_loops_split_at_branches_and_their_targets(load_script):
    blocks = load_script("sass_blocks")
    code = [(0x00, "MOV R1, R2"),
            (0x10, "SYNCS.PHASECHK P0, [UR4]"),                 # inner loop starts here (0x10)
            (0x20, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ"),
            (0x30, "@P1 BRA 0x60"),
            (0x40, "FSEL R3, R4, -INF, P2"),                    # masked
            (0x50, "BRA 0x70"),
            (0x60, "FFMA R3, R4, R5, R6"),                      # unmasked
            (0x70, "MUFU.EX2 R3, R3"),
            (0x80, "@P0 BRA 0x10"),                             # end of the inner loop
            (0x90, "@P3 BRA 0x00"),                             # outer loop: not innermost
            (0xa0, "FADD R1, R1, R1"),
            (0xb0, "@P4 BRA 0xa0"),                             # a loop without wgmma: left out
            (0xc0, "EXIT")]
    [loop] = blocks.inner_loops(code)
    assert [[a for a, _ in b] for b in loop] == [[0x10, 0x20, 0x30], [0x40, 0x50], [0x60], [0x70, 0x80]]
    assert blocks._opcode("@!P0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ") == "HGMMA"
