"""Checks the Doxygen HTML of the project's Markdown pages for Markdown that did not render.

    check_rendered_docs.py HTML_DIR

Doxygen (1.9) leaves `**` literally around bold text that starts with a code span or ends in one
followed by punctuation, and reads a single-backtick code span holding an apostrophe (`q'`) as a
`quoted' pair, which garbles the rest of the line. In the rendered text of every page made from a
.md file (tags stripped, code spans, code blocks and formulas removed) this finds a literal `**`,
a stray backtick, a literal <tt> (Doxygen 1.9 writes a code span in a section heading as
escaped HTML), or a curly quote next to a code span, and prints each with its page and
context. Exit status 0 when none is found, 1 otherwise, 2 when HTML_DIR holds no such page.
"""
import html
import os
import re
import sys


def text_of(page):
    """The page's contents as text, without code, preformatted blocks and MathJax formulas."""
    start = page.find('<div class="contents">')
    body = page[start:] if start >= 0 else page
    body = re.sub(r'<div class="fragment">.*?</div><!-- fragment -->', " ", body, flags=re.S)
    body = re.sub(r"<pre[^>]*>.*?</pre>", " ", body, flags=re.S)
    body = re.sub(r"<code>.*?</code>", "\x00", body, flags=re.S)  # code spans: a marker
    body = re.sub(r"\\\(.*?\\\)|\\\[.*?\\\]", " ", body, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def problems(text):
    for pattern, what in ((r"\*\*", "literal **"), (r"`", "stray backtick"),
                          (r"</?(?:tt|code|b|em)>", "literal HTML tag (a code span in a heading)"),
                          (r"\x00[\u2018\u2019]|[\u2018\u2019]\x00", "curly quote next to a code span")):
        for m in re.finditer(pattern, text):
            context = text[max(0, m.start() - 60):m.end() + 60].replace("\x00", "<code>").replace("\n", " ")
            yield what, context


def main():
    root = sys.argv[1]
    pages = sorted(f for f in os.listdir(root) if f.startswith("md_") or f == "index.html")
    if not any(p.startswith("md_") for p in pages):
        print(f"{root}: no page rendered from a .md file (md_*.html); was the docs target built?")
        return 2
    found = 0
    for p in pages:
        with open(os.path.join(root, p), encoding="utf-8") as f:
            for what, context in problems(text_of(f.read())):
                found += 1
                print(f"{p}: {what}: ...{context}...")
    print(f"{len(pages)} pages checked, {found} rendering problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
