"""The grader's trust boundary, in process (milliseconds): the plain-data codec between the
checker and the function worker, the stripped library, the secret-drawn hidden cases and the
cleaning of messages that reach the feedback."""

import ast
import json
from collections import OrderedDict

import numpy as np
import pytest
import torch

from ai_evolution.engine import KVBlock, SamplingParams
from ai_evolution.engine.block_pool import BlockPool
from ai_evolution.grading import find_assessment
from ai_evolution.grading import codec, stripped
from ai_evolution.grading.codec import CodecError, Decoder, Encoder, apply_updates
from ai_evolution.grading.proxy import clean_message, redactor
from ai_evolution.model import ModelConfig, get_preset


def roundtrip(value):
    wire = json.loads(codec.dumps({"v": Encoder().encode(value)}))
    return Decoder().decode(wire["v"])


def test_plain_values_round_trip_with_their_types():
    value = [None, True, 3, -2**70, 1.5, float("inf"), "ñ", (1, (2, "x")), {1: "a", (2, 3): [4]},
             {"a": {"b": []}}, b"\x00\xff", {1, 2}, frozenset({"z"}), OrderedDict([(3, 1), (1, 2)])]
    back = roundtrip(value)
    assert back == value
    assert [type(x) for x in back] == [type(x) for x in value]
    assert list(back[-1]) == [3, 1]


def test_a_flat_list_crosses_whole_and_keeps_the_checks_of_its_items():
    """A list of plain scalars skips the item-by-item walk (a check's callbacks carry samples
    thousands of times), with the same result: a copy, exact types, depth and subclass checks."""
    flat = [0.25, 3, None, True, "x", -2**70, float("nan")]
    encoded = Encoder().encode(flat)
    assert encoded is not flat and encoded[:6] == flat[:6]
    back = roundtrip(flat)
    assert back[:6] == flat[:6] and [type(x) for x in back] == [type(x) for x in flat]
    wire = [1.0, 2.0]
    decoded = Decoder().decode(wire)
    assert decoded == wire and decoded is not wire
    with pytest.raises(CodecError, match="no puede cruzar"):
        Encoder().encode([1.0, MyInt(3), 2.0])  # one item of a subclass: refused as before
    with pytest.raises(CodecError):
        Decoder().decode([1.0, {"$pickle": "gASV"}])
    deep: list = [1.0, 2.0]
    for _ in range(codec.MAX_DEPTH):
        deep = [deep]
    with pytest.raises(CodecError, match="anidado"):  # the flat list at the bottom is too deep
        Encoder().encode(deep)
    with pytest.raises(CodecError, match="anidado"):
        Decoder().decode(json.loads(json.dumps(deep)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8,
                                   torch.int64, torch.bool, torch.uint8])
def test_tensors_cross_as_dtype_shape_and_bytes(dtype):
    t = (torch.randn(3, 4, 5) * 10).to(dtype)
    back = roundtrip(t)
    assert type(back) is torch.Tensor and back.dtype == dtype and back.shape == t.shape
    assert torch.equal(back, t)
    assert roundtrip(torch.empty(0, 3)).shape == (0, 3)
    assert roundtrip(torch.tensor(2.5)).item() == 2.5


def test_arrays_numpy_scalars_and_dtypes_round_trip():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    back = roundtrip(a)
    assert type(back) is np.ndarray and back.dtype == a.dtype and np.array_equal(back, a)
    x = np.float64(0.1)
    assert type(roundtrip(x)) is np.float64 and roundtrip(x) == x
    assert roundtrip(np.int32(-7)) == -7 and type(roundtrip(np.int32(-7))) is np.int32
    assert roundtrip(torch.bfloat16) is torch.bfloat16
    assert roundtrip(np.dtype("int16")) == np.dtype("int16")


def test_library_value_types_are_rebuilt_field_by_field():
    cfg = get_preset("llama-3.1-8b")
    back = roundtrip(cfg)
    assert type(back) is ModelConfig and back == cfg
    sp = roundtrip(SamplingParams(max_tokens=3, ignore_eos=True))
    assert type(sp) is SamplingParams and sp.max_tokens == 3
    pool = BlockPool(4, 2)
    pool.allocate(2)
    copy = roundtrip(pool)
    assert [b.ref_cnt for b in copy.blocks] == [1, 1, 0, 0] and list(copy._free) == [2, 3]


class MyInt(int):
    pass


class MyDict(dict):
    pass


class Custom:
    def __eq__(self, other):
        return True


class MyConfig(ModelConfig):
    pass


@pytest.mark.parametrize("value", [MyInt(3), MyDict(a=1), Custom(), [Custom()], len, json,
                                   lambda: 0, np.array([Custom()], dtype=object), type,
                                   MyConfig(num_layers=1, hidden_size=8, num_heads=2,
                                            num_kv_heads=2, intermediate_size=8, vocab_size=10)])
def test_a_subclass_custom_object_or_callable_cannot_cross(value):
    with pytest.raises(CodecError, match="no puede cruzar|array de objetos"):
        Encoder().encode(value)


@pytest.mark.parametrize("wire", [
    {"$obj": "os:system", "id": 1, "f": {}},                       # not an allowed type
    {"$obj": "builtins:eval", "id": 1, "f": {}},
    {"$enum": "ai_evolution.grading.notebook:RunInfo", "name": "x"},
    {"$pickle": "gASV"},                                            # unknown tag
    {"$ref": 99},                                                   # unknown object
    {"$tensor": "float32", "shape": [1000], "b": ""},               # bytes do not match
    {"$array": "O", "shape": [1], "b": "AA=="},                     # object dtype
    {"$obj": "ai_evolution.model.config:ModelConfig", "id": 1, "f": {"__class__": 1}},
])
def test_decoding_refuses_anything_outside_the_protocol(wire):
    with pytest.raises(CodecError):
        Decoder().decode(wire)


def test_messages_are_bounded_in_size_and_depth(monkeypatch):
    monkeypatch.setattr(codec, "MAX_MESSAGE_BYTES", 10_000)
    with pytest.raises(CodecError, match="MiB"):
        codec.dumps({"v": Encoder().encode(torch.zeros(10_000))})
    with pytest.raises(CodecError, match="MiB"):
        codec.loads(b"[" * 20_000)
    deep: list = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(CodecError, match="anidado"):
        Encoder().encode(deep)
    with pytest.raises(CodecError):
        codec.loads(b"[" * 5000 + b"]" * 5000)  # parses to a list, not a message


def test_in_place_changes_come_back_into_the_callers_objects():
    cache = torch.zeros(2, 3)
    pool = BlockPool(3, 2)
    enc = Encoder()
    sent = [enc.encode(cache), enc.encode(pool)]
    known = {k: obj for obj in (cache, pool, *pool.blocks) for i, k in enc.ids.items()
             if i == id(obj)}
    # The worker's side: decode, change in place, answer with a reference and the updates.
    dec = Decoder()
    w_cache, w_pool = (dec.decode(x) for x in sent)
    w_cache[1] = 7.0
    w_pool.allocate(1)
    ids = {id(o): k for k, o in dec.known.items()}
    answer = Encoder(ids, 100)
    result = answer.encode(w_pool.blocks[0])
    updates = [[k, ({"$obj": codec.type_name(o), "f": answer.fields(o)} if k not in (1,)
                    else {k2: v for k2, v in Encoder().encode(o).items() if k2 != "id"})]
               for k, o in dec.known.items()]
    back = Decoder(known)
    assert back.decode(result) is pool.blocks[0]
    apply_updates(updates, back)
    assert cache[1].tolist() == [7.0] * 3 and pool.blocks[0].ref_cnt == 1
    assert list(pool._free) == [1, 2]
    with pytest.raises(CodecError, match="forma"):
        apply_updates([[1, {k: v for k, v in Encoder().encode(torch.zeros(4)).items()
                            if k != "id"}]], back)


def test_the_stripped_library_has_no_graded_reference_in_it(tmp_path):
    a = find_assessment("kv_cache")
    targets = stripped.targets(a)
    assert targets["ai_evolution.model.memory"] == {"kv_bytes_per_token"}
    assert targets["ai_evolution.model.attention"] == {"cached_attention"}
    root = stripped.build(a, tmp_path) / "ai_evolution"
    for module, names in targets.items():
        path = root.joinpath(*module.split(".")[1:]).with_suffix(".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defs = {n.name: n for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for name in names:
            body = defs[name.split(".")[-1]].body
            assert len(body) == 1 and isinstance(body[0], ast.Raise)
            assert "NotImplementedError" in ast.unparse(body[0])
    # The rest of the library is still there (the student's code may use it).
    assert "def weight_bytes" in (root / "model" / "memory.py").read_text(encoding="utf-8")


def test_a_class_exercise_loses_only_its_graded_methods():
    source = ("class BlockPool:\n    def allocate(self, n):\n        return 1\n"
              "    def touch(self, b):\n        return 2\n")
    out = stripped.strip_source(source, {"BlockPool.allocate"})
    assert "NotImplementedError" in out and "return 2" in out and "return 1" not in out
    from ai_evolution.grading.assessment import AssessmentError

    with pytest.raises(AssessmentError, match="no se encontró"):
        stripped.strip_source(source, {"BlockPool.free"})


def test_hidden_seeds_come_from_the_secret_and_the_nonce():
    a = find_assessment("kv_cache")
    one = a.context(0, secret=b"clave", nonce="n1")
    assert one.hidden_seeds == a.context(0, secret=b"clave", nonce="n1").hidden_seeds
    assert one.hidden_seeds != a.context(0, secret=b"otra", nonce="n1").hidden_seeds
    assert one.hidden_seeds != a.context(0, secret=b"clave", nonce="n2").hidden_seeds
    assert one.rng("x").integers(1 << 30) == a.context(0, b"clave", "n1").rng("x").integers(1 << 30)
    assert len(one.hidden_seeds) == 2 and all(0 <= s < 2**31 for s in one.hidden_seeds)


def test_the_secret_comes_from_a_file_the_environment_or_is_generated(tmp_path, monkeypatch):
    from ai_evolution.grading.secret import NONCE_ENV, SECRET_ENV, resolve

    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(NONCE_ENV, raising=False)
    key = tmp_path / "clave"
    key.write_bytes(b"secreto\n")
    run = resolve(key, "abc")
    assert (run.secret, run.source, run.nonce) == (b"secreto", "archivo", "abc")
    assert "secreto" not in run.record("kv_cache", 0)
    monkeypatch.setenv(SECRET_ENV, "del-entorno")
    assert resolve().source == "entorno" and resolve().nonce != resolve().nonce
    monkeypatch.delenv(SECRET_ENV)
    assert resolve().source == "generado"
    with pytest.raises(ValueError, match="no existe"):
        resolve(tmp_path / "no-existe")
    with pytest.raises(ValueError, match="imprimible"):
        resolve(key, "dos\nlíneas")
    (tmp_path / "vacio").write_text("")
    with pytest.raises(ValueError, match="vacío"):
        resolve(tmp_path / "vacio")


def test_messages_from_the_worker_lose_hidden_text_paths_and_length(tmp_path):
    (tmp_path / "hidden_checks.py").write_text(
        "def _secret_edges(fn):\n    cases = [(mqa, 'int4'), (mqa, 'fp8')]\n", encoding="utf-8")
    redact = redactor(tmp_path)
    leaked = "FileNotFoundError: def _secret_edges(fn): cases = [(mqa, 'int4'), (mqa, 'fp8')]"
    out = clean_message(leaked + " /work/x/assessments/02-kv-cache/hidden_checks.py " + "x" * 900,
                        redact)
    assert "_secret_edges" not in out and "mqa" not in out and "assessments" not in out
    assert len(out) <= 300 and out.endswith("…")
    # A line cut anywhere (the worker truncates long messages) is still recognised.
    cut = "ValueError: x = 1; " + "    cases = [(mqa, 'int4'), (mqa, 'f"[7:]
    assert "mqa, 'int4'" not in redact(cut) and "[texto oculto]" in redact(cut)
    assert redact("nada de esto es secreto") == "nada de esto es secreto"


def test_an_error_from_the_worker_keeps_its_builtin_type_and_nothing_else():
    from ai_evolution.grading.proxy import StudentError, student_error

    err = student_error("ValueError", "rate debe ser > 0", "su función lanzó ValueError: …")
    assert isinstance(err, ValueError) and isinstance(err, StudentError)  # checks expecting it
    assert str(err) == "rate debe ser > 0" and err.feedback.startswith("su función lanzó")
    assert isinstance(student_error("ZeroDivisionError", "", ""), ArithmeticError)
    own = student_error("MiError", "x", "y")  # a class the student wrote: only its name crosses
    assert type(own) is StudentError and own.type_name == "MiError"
    assert type(student_error("SystemExit", "", "")) is StudentError  # not an Exception


def test_the_stripped_library_holds_no_reference_answer_of_any_lab(tmp_path):
    """Every function and class of ``ai_evolution.reference`` is a stub in the worker's copy
    (for any lab), the modules that import them still import, and calling one raises."""
    import subprocess
    import sys

    root = stripped.build(find_assessment("paged_attention"), tmp_path) / "ai_evolution"
    modules = stripped.reference_targets()
    assert "reference_decode_roofline" in modules["ai_evolution.reference.roofline"]
    assert "simulated_gains" in modules["ai_evolution.reference.continuous_batching"]
    for path in sorted((root / "reference").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
            elif isinstance(node, ast.ClassDef):
                body = [n for n in node.body if isinstance(n, ast.FunctionDef)][0].body
            else:
                continue
            assert len(body) == 1 and "NotImplementedError" in ast.unparse(body[0]), \
                f"{path.name}: {node.name} still holds its answer"
    probe = ("import ai_evolution.labs.roofline, ai_evolution.checks.roofline\n"
             "from ai_evolution.reference.roofline import reference_predict_step\n"
             "from ai_evolution.model import get_preset\n"
             "try:\n    reference_predict_step(1e9, 1e9, 1e12, 1e15, 0.0)\n"
             "except NotImplementedError as err:\n    print('stub:', err)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin"},
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("stub: `reference_predict_step` no está disponible"), done.stdout
    # The lab's own graded references, outside the package, are stubs too; the rest is intact.
    pool = (root / "engine" / "block_pool.py").read_text(encoding="utf-8")
    assert "def touch" in pool and pool.count("no está disponible en el corrector") == 2


def test_a_submission_may_not_import_the_reference_answers():
    from ai_evolution.grading.rebuild import screen

    for line in ("from ai_evolution.reference.roofline import reference_decode_roofline",
                 "import ai_evolution.reference", "from ai_evolution import reference"):
        problems = screen(ast.parse(line).body[0], set())
        assert problems and "parte del corrector" in problems[0], line
