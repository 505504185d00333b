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


def test_significant_digits_with_decimal_comma():
    from ai_evolution.fmt import es_sig
    assert es_sig(0.0123456, 3) == "0,0123"
    assert es_sig(2.0) == "2" and es_sig(0) == "0"
    assert es_sig(-0.25) == "\u22120,25"
    assert es_sig(1.5e-6) == "1,5 × 10⁻⁶"
    assert "." not in es_sig(3.25e17)


def test_returned_values_are_shown_with_decimal_comma_and_semicolons():
    import numpy as np

    from ai_evolution.fmt import es_value
    assert es_value([0.5, 2]) == "[0,5; 2]"
    assert es_value({"time_s": 0.5, "bound": "memory"}) == "{'time_s': 0,5; 'bound': 'memory'}"
    assert es_value(np.float64(0.25)) == "0,25"
    assert es_value(None) == "None" and es_value("x") == "'x'" and es_value(True) == "True"


def test_counts_take_the_number_of_their_noun():
    from ai_evolution.fmt import es_count
    assert es_count(1, "hilo") == "1 hilo" and es_count(4, "hilo") == "4 hilos"
    assert es_count(0, "par", "pares") == "0 pares"
    assert es_count(2, "valor", "valores") == "2 valores" and es_count(12000, "token") == "12\u00a0000 tokens"


def test_a_byte_column_keeps_one_binary_unit():
    from ai_evolution.fmt import es_bytes_column
    assert es_bytes_column([1000, 2**20, 3 * 2**20 + 5]) == ["0,977 KiB", "1 MiB", "3 MiB"]
    assert es_bytes_column([512, 2048, 2.36e6]) == ["0,5 KiB", "2 KiB", "2,25 MiB"]
    assert es_bytes_column([2**31, 8.61e9]) == ["2 GiB", "8,02 GiB"]
    assert not any(u in " ".join(es_bytes_column([1e3, 1e6, 1e9])) for u in (" kB", " MB", " GB"))
