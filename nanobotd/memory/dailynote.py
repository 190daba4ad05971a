"""Daily notes (`memory/YYYY-MM-DD.md`): parse, merge bullets into a section, render, validate. Shared with agent and
user, so parsing is lossless (what we do not understand is kept byte for byte) and a merge touches one section."""

from __future__ import annotations

import hashlib
import re
import stat
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

NOTE_SECTIONS = ("Topics", "Decisions", "Tool Activity", "Open Questions")
ARCHIVE_DIR_NAME = "archive"
NOTE_NAME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})\.md$")
# Anything named like a dated note is expected to be one; other files in memory/ are not ours to judge.
NOTE_LIKE_NAME = re.compile(r"^\d{4}-\d{1,2}-\d{1,2}")
BULLET_MARKERS = ("- ", "* ", "+ ")
FENCE_MARKERS = ("```", "~~~")
TRAILING_PUNCTUATION = ".,;:!?…"
BULLET_MAX_CHARS = 1000
BULLET_DIGEST_CHARS = 16


class NoteError(ValueError):
    """A file that cannot be treated as a daily note; the message is the reason, for reports."""


@dataclass
class Section:
    """One `## ` section: its heading line first, then its body lines, each with its own line ending."""

    name: str
    lines: list[str]

    def bullet_lines(self) -> list[tuple[int, str]]:
        """(index in lines, text) of every top-level bullet."""
        return [(index, line[2:].strip()) for index, line in enumerate(self.lines) if index and
                line.startswith(BULLET_MARKERS)]


@dataclass
class DailyNote:
    """A parsed note: the text before the first section, then the sections in file order."""

    head: list[str] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)

    def section(self, name: str) -> Section | None:
        """The first section whose heading matches *name* (case and spacing ignored)."""
        return next((section for section in self.sections if heading_key(section.name) == heading_key(name)), None)

    def bullets(self, name: str) -> list[str]:
        """The bullet texts of section *name* (empty when the section is missing)."""
        section = self.section(name)
        return [text for _, text in section.bullet_lines()] if section else []

    def render(self) -> str:
        """The note as text; parse(text).render() == text for any input."""
        return "".join(self.head) + "".join("".join(section.lines) for section in self.sections)


def heading_key(name: str) -> str:
    """A heading's comparison key: a heading whose case or spacing changed is still the same section."""
    return " ".join(name.split()).casefold()


def parse_note(text: str) -> DailyNote:
    """Split *text* into head and `## ` sections, ignoring headings inside fenced code blocks."""
    note = DailyNote()
    in_fence = False
    for line in text.splitlines(keepends=True):
        if line.lstrip().startswith(FENCE_MARKERS):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            note.sections.append(Section(line[3:].strip(), [line]))
        elif note.sections:
            note.sections[-1].lines.append(line)
        else:
            note.head.append(line)
    return note


def new_note(day: date) -> DailyNote:
    """An empty note for *day*: the title line and a blank line."""
    return DailyNote(head=[f"# {day.isoformat()}\n", "\n"])


def normalise_bullet(text: str) -> str:
    """The comparison key of a bullet: no marker, single spaces, no case, no trailing punctuation."""
    text = text.strip()
    while text.startswith(BULLET_MARKERS) or text in ("-", "*", "+"):
        text = text[2:].strip()
    text = " ".join(text.split()).casefold()
    return text.rstrip(TRAILING_PUNCTUATION + " ")


def clean_bullet(text: str) -> str:
    """A bullet's text fit for one line: no marker, no line breaks, bounded length."""
    text = " ".join(text.split())
    while text.startswith(BULLET_MARKERS):
        text = text[2:].strip()
    if len(text) > BULLET_MAX_CHARS:
        text = text[:BULLET_MAX_CHARS].rstrip() + " …"
    return text


def merge_bullets(note: DailyNote, section_name: str, bullets: list[str]) -> list[str]:
    """Add the bullets not already in section *section_name* (created when missing) after its last non-blank
    line, so the blank lines before the next section stay; return those added."""
    section = note.section(section_name)
    seen = {normalise_bullet(text) for _, text in section.bullet_lines()} if section else set()
    added = []
    for bullet in bullets:
        text = clean_bullet(bullet)
        key = normalise_bullet(text)
        if key and key not in seen:
            seen.add(key)
            added.append(text)
    if not added:
        return []
    if section is None:
        section = _insert_section(note, section_name)
    position = next((index for index in range(len(section.lines) - 1, 0, -1) if section.lines[index].strip()), 0)
    if not section.lines[position].endswith(("\n", "\r")):
        section.lines[position] += "\n"
    section.lines[position + 1:position + 1] = [f"- {text}\n" for text in added]
    return added


def remove_bullets(note: DailyNote, section_name: str, bullets: list[str]) -> list[str]:
    """Remove one bullet per entry of *bullets* (compared normalised) from a section; return those removed."""
    section = note.section(section_name)
    if section is None:
        return []
    wanted = [normalise_bullet(text) for text in bullets]
    removed, drop = [], set()
    for index, text in section.bullet_lines():
        key = normalise_bullet(text)
        if key in wanted:
            wanted.remove(key)
            drop.add(index)
            removed.append(text)
    section.lines = [line for index, line in enumerate(section.lines) if index not in drop]
    return removed


def drop_empty_sections(note: DailyNote, names: list[str]) -> None:
    """Remove sections among *names* that hold nothing but blank lines (undoing a merge that created them)."""
    keys = {heading_key(name) for name in names}
    note.sections = [
        section for section in note.sections
        if heading_key(section.name) not in keys or any(line.strip() for line in section.lines[1:])
    ]


def _insert_section(note: DailyNote, name: str) -> Section:
    """A canonical section after the canonical ones before it in NOTE_SECTIONS, else first: user sections stay."""
    canonical = _canonical_name(name)
    order = NOTE_SECTIONS.index(canonical) if canonical in NOTE_SECTIONS else len(NOTE_SECTIONS)
    position = 0
    for index, section in enumerate(note.sections):
        other = _canonical_name(section.name)
        if other in NOTE_SECTIONS and NOTE_SECTIONS.index(other) < order:
            position = index + 1
    previous = note.sections[position - 1].lines if position > 0 else note.head
    _end_with_blank_line(previous)
    section = Section(canonical, [f"## {canonical}\n"])
    note.sections.insert(position, section)
    if position < len(note.sections) - 1:
        section.lines.append("\n")
    return section


def _end_with_blank_line(lines: list[str]) -> None:
    if not lines:
        return
    if not lines[-1].endswith(("\n", "\r")):
        lines[-1] += "\n"
    if lines[-1].strip():
        lines.append("\n")


def _canonical_name(name: str) -> str:
    return next((canonical for canonical in NOTE_SECTIONS if heading_key(canonical) == heading_key(name)),
                name.strip())


# -- files -------------------------------------------------------------------------------------------

def note_path(memory_dir: Path, day: date) -> Path:
    """Where the note of *day* lives."""
    return memory_dir / f"{day.isoformat()}.md"


def note_date(name: str) -> date:
    """The day a note file is for, from its name; NoteError for other names and impossible dates."""
    match = NOTE_NAME.match(name)
    if not match:
        raise NoteError(f"{name} is not a daily note (expected YYYY-MM-DD.md)")
    year, month, day = (int(part) for part in match.groups())
    try:
        return date(year, month, day)
    except ValueError as exc:
        raise NoteError(f"{name} is named with an impossible date ({exc})") from exc


def decode_note(data: bytes, name: str = "note") -> DailyNote:
    """Parse note bytes; NoteError when they are not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NoteError(f"{name} is not valid UTF-8 (byte {exc.start})") from exc
    return parse_note(text)


def read_note(path: Path) -> DailyNote:
    """Read and parse a note strictly (UTF-8)."""
    return decode_note(path.read_bytes(), path.name)


@dataclass(frozen=True)
class NoteFile:
    """A valid daily note on disk."""

    path: Path
    day: date
    size: int


@dataclass
class NoteScan:
    """The notes of a memory folder: active ones, archived ones, and what had to be left alone."""

    active: list[NoteFile] = field(default_factory=list)
    archived: list[NoteFile] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    archive_usable: bool = True


def check_note_file(path: Path) -> NoteFile:
    """Validate one note file (name, date, regular file, UTF-8, has sections); NoteError says why not."""
    day = note_date(path.name)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise NoteError(f"{path.name} is a symlink")
    if not stat.S_ISREG(info.st_mode):
        raise NoteError(f"{path.name} is not a regular file")
    note = read_note(path)
    if not note.sections:
        raise NoteError(f"{path.name} has no ## sections")
    return NoteFile(path, day, info.st_size)


def scan_notes(memory_dir: Path) -> NoteScan:
    """Classify every daily note under *memory_dir* and its archive folder; never raises for bad files."""
    scan = NoteScan()
    workspace = memory_dir.parent
    for path in _listing(memory_dir):
        if NOTE_LIKE_NAME.match(path.name):
            _classify(path, scan.active, scan.skipped, workspace)
    archive = memory_dir / ARCHIVE_DIR_NAME
    if archive.is_symlink() or (archive.exists() and not archive.is_dir()):
        kind = "a symlink" if archive.is_symlink() else "not a folder"
        scan.skipped.append({"path": str(archive.relative_to(workspace)), "reason": f"archive folder is {kind}"})
        scan.archive_usable = False
        return scan
    for path in _listing(archive):
        _classify(path, scan.archived, scan.skipped, workspace)
    return scan


def _listing(folder: Path) -> list[Path]:  # hidden files are not notes
    try:
        return sorted(path for path in folder.iterdir() if not path.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _classify(path: Path, valid: list[NoteFile], skipped: list[dict], workspace: Path) -> None:
    try:
        valid.append(check_note_file(path))
    except NoteError as exc:
        skipped.append({"path": str(path.relative_to(workspace)), "reason": str(exc)})
    except OSError as exc:
        skipped.append({"path": str(path.relative_to(workspace)), "reason": f"unreadable: {exc.strerror or exc}"})


# -- bullets, for the dream --------------------------------------------------------------------------

@dataclass(frozen=True)
class NoteBullet:
    """One section bullet of a daily note, as the dream reads it."""

    day: date
    section: str
    text: str

    @property
    def digest(self) -> str:
        """Names the bullet across moves to the archive and changes of case or spacing; a reworded one is new."""
        return hashlib.sha256(normalise_bullet(self.text).encode("utf-8")).hexdigest()[:BULLET_DIGEST_CHARS]


def note_bullets(memory_dir: Path) -> list[NoteBullet]:
    """Every section bullet of the valid daily notes, active and archived, oldest day first."""
    scan = scan_notes(memory_dir)
    bullets = []
    for note_file in sorted(scan.active + scan.archived, key=lambda found: found.day):
        try:
            note = read_note(note_file.path)
        except (OSError, NoteError):
            continue  # changed since the scan; the next reader sees it
        for section in note.sections:
            bullets.extend(NoteBullet(note_file.day, section.name, text)
                           for _, text in section.bullet_lines() if text)
    return bullets
