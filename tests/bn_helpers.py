"""Helpers for tests that compare with pyAgrum."""

import re


def _is_number(word):
    try:
        float(word)
        return True
    except ValueError:
        return False


def pyagrum_network(gum, text, tmp_path):
    """pyAgrum's network for a BIF text, and a map back from any labels renamed for it."""
    plain = tmp_path / "net.bif"  # pyAgrum reads uncompressed files only
    plain.write_text(text)
    try:
        return gum.loadBN(str(plain)), {}
    except Exception:
        # pyAgrum's grammar refuses labels like '<5', '5-12' or 'Asy/Patch' (child.bif):
        # give it plain identifiers instead and map them back when comparing.
        renamed = {}

        def rename(m):
            word = m.group()
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", word) or _is_number(word):
                return word
            return renamed.setdefault(word, f"label{len(renamed)}_")

        plain.write_text(re.sub(r"[^\s{}()\[\],;|]+", rename, text))
        return gum.loadBN(str(plain)), {new: old for old, new in renamed.items()}
