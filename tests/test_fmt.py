"""Numbers as the book prints them: decimal comma, spaced thousands, typographic minus."""

from ai_evolution.fmt import es, es_bytes


def test_decimal_comma_and_thousands():
    assert es(0.5) == "0,50"
    assert es(2.147483648) == "2,15"
    assert es(1234.5, 1) == "1234,5"  # four digits keep no separator
    assert es(131072, 0) == "131\u00a0072"


def test_negative_numbers_use_a_minus_sign():
    assert es(-1.25, 1) == "\u22121,2" or es(-1.25, 1) == "\u22121,3"


def test_byte_units():
    assert es_bytes(131072) == "128 KiB"
    assert es_bytes(2**19) == "512 KiB"
    assert es_bytes(2.147483648e9) == "2,15 GB"
    assert es_bytes(1536) == "1,54 kB"
