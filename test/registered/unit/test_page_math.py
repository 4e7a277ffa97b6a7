"""Page math edge cases: page size 1, exact multiples, empty, full hit, bad input."""

import pytest

from sglang_pd.srt.mem_cache import kv_to_page_num, page_align_floor

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("tokens,page,expected", [
    (0, 1, 0), (7, 1, 7), (0, 16, 0), (15, 16, 0), (16, 16, 16), (17, 16, 16), (47, 16, 32), (48, 16, 48),
])
def test_page_align_floor(tokens, page, expected):
    assert page_align_floor(tokens, page) == expected


@pytest.mark.parametrize("tokens,page,expected", [
    (0, 1, 0), (5, 1, 5), (0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2), (32, 16, 2), (33, 16, 3),
])
def test_kv_to_page_num(tokens, page, expected):
    assert kv_to_page_num(tokens, page) == expected


def test_bad_page_size_rejected():
    for fn in (page_align_floor, kv_to_page_num):
        with pytest.raises(ValueError, match="page_size must be >= 1"):
            fn(4, 0)
