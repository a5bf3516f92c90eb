"""The README's C++ example is the compiled examples/consumer/main.cpp, verbatim."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_readme_example_is_the_compiled_consumer():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    source = (ROOT / "examples" / "consumer" / "main.cpp").read_text(encoding="utf-8")
    assert "```cpp\n" + source + "```" in readme
