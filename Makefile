# Build and test entry points. README: `make book` and `make test`.
# Works from a fresh clone: the first target that needs the venv creates it.

VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# Profile the labs use while the book executes them (ci: 2-core CPU, small workloads).
BOOK_PROFILE ?= ci
# Notebook pages executed at once before the build (one torch thread each).
BOOK_JOBS ?= 2
# Edition of the book: full (lab pages show the solutions) or student (lab pages show the
# student notebooks' code, for a cohort: `make book EDITION=student`; see _ext/lab_pages.py).
EDITION ?= full
# Bytecode is cached (in the tree's ignored __pycache__ folders) also where the environment says
# PYTHONDONTWRITEBYTECODE: otherwise every pytest worker rewrites the asserts of every test module
# again (about 6 s of CPU each) and every kernel, script and test process compiles the package.
# Grading sandboxes still write none (ai_evolution/grading/sandbox.py); the stripped library a
# function worker sees is copied without __pycache__.
unexport PYTHONDONTWRITEBYTECODE

.DEFAULT_GOAL := book
.PHONY: book test check student sync outputs release clean venv

venv: $(VENV)/.installed

# The stamp is rebuilt when the pinned requirements or the package metadata change.
# pip is not upgraded: the venv's own pip installs the pinned set.
$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -r requirements.txt -c constraints.txt
	$(BIN)/pip install -e . --no-deps
	touch $@

book: export AI_EVOLUTION_PROFILE = $(BOOK_PROFILE)
book: export AI_EVOLUTION_EDITION = $(EDITION)
# Pages execute BOOK_JOBS at a time into the build's execution cache, then the build finds them
# cached (scripts/execute_book.py): each page executes once.
book: $(VENV)/.installed
	$(BIN)/python scripts/execute_book.py --jobs $(BOOK_JOBS)
	$(BIN)/jupyter-book build --all -W -n --keep-going .

# The whole suite (what CI runs); the 15 slowest tests are listed at the end. Two workers: one
# builds the book and checks what reads it, the other runs the rest (groups in tests/conftest.py).
test: $(VENV)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder --durations=15

# The everyday tier while editing: unit, property, engine, server and lab tests; no notebook
# execution, no book build, no grading kernels, no Chromium, no second run of a whole lab (those
# are marked `slow`, see tests/conftest.py).
# Two workers (pytest-xdist): every test in this tier is independent of the others' process.
check: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m "not slow" -n 2 --durations=10

# Student notebooks, and every lab's install cell (git+URL@VERSION of _config.yml's repository
# section; also written into the paired solution .ipynb).
student: $(VENV)/.installed
	$(BIN)/python scripts/make_student.py

# A pinned term (book/instructor-guide.md): `make release VERSION=2027.1` checks the tree is
# clean, runs RELEASE_TEST (the whole suite), writes the version into the package, _config.yml
# and the notebooks, commits and tags v2027.1 (nothing is pushed). scripts/release.py says how.
RELEASE_TEST ?= $(MAKE) test
release: $(VENV)/.installed
	$(BIN)/python scripts/release.py "$(VERSION)" --test "$(RELEASE_TEST)"

# One-way update: the MyST .md is the source, the paired .ipynb follows it (keeps cell ids).
sync: $(VENV)/.installed
	$(BIN)/jupytext --to ipynb --update labs/*/notebook_solution.md

# After an intended change of a lab's checked outputs: store the fresh build's in the paired
# notebooks (make test compares the book's execution with them; scripts/store_checked_outputs.py).
outputs: $(VENV)/.installed
	$(BIN)/python scripts/store_checked_outputs.py

# Removes the build output (including the execution cache); keeps the venv.
clean:
	rm -rf _build
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
