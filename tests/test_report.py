"""Reports: a real metrics.jsonl in, a decodable PNG and an HTML page with the right figures out."""

from __future__ import annotations

import base64
import html.parser
import json
import math
from pathlib import Path

import pytest

from tpulm import report, rundir, storage
from tpulm.cli import main
from tpulm.errors import TpulmError

matplotlib_image = pytest.importorskip("matplotlib.image")

STEPS, LOG_EVERY, EVAL_EVERY, WARMUP, PEAK_LR = 400, 10, 100, 20, 5e-4
BATCH, SEQ = 16, 128
CONFIG = '[model]\nhidden_size = 128\nnum_layers = 2\n\n[train]\nname = "a <demo> & more"\n'


def make_records(first: int = LOG_EVERY, last: int = STEPS, shift: float = 0.0) -> list[dict]:
    """A plausible run: loss decays to ~2.3, accuracy rises, warmup then linear decay."""
    records = []
    for step in range(first, last + 1, LOG_EVERY):
        lr = PEAK_LR * min(step / WARMUP, (STEPS - step) / (STEPS - WARMUP))
        loss = 2.3 + 7.5 * math.exp(-step / 90) + 0.05 * math.sin(step / 9) + shift
        records.append({
            "split": "train", "step": step, "time": 1.25 * step, "tokens": step * BATCH * SEQ,
            "loss": loss, "accuracy": 0.5 * (1 - math.exp(-step / 150)),
            "learning_rate": lr, "tokens_per_second": 800.0 if step == first else 4000 + step,
        })
        if step % EVAL_EVERY == 0:
            eval_loss = loss + 0.2
            records.append({
                "split": "eval", "step": step, "time": 1.25 * step + 3,
                "tokens": step * BATCH * SEQ,
                "loss": eval_loss, "accuracy": 0.48 * (1 - math.exp(-step / 150)),
                "perplexity": math.exp(eval_loss),
            })
    return records


def write_run(run_dir: str, records: list[dict], config: str | None = CONFIG) -> None:
    storage.makedirs(run_dir)
    text = "".join(json.dumps(r) + "\n" for r in records)
    storage.write_text(storage.join(run_dir, rundir.METRICS_NAME), text)
    if config is not None:
        storage.write_text(storage.join(run_dir, rundir.CONFIG_NAME), config)


class _Cells(html.parser.HTMLParser):
    """Collects the figure cells (data-key -> (data-value, shown text)), images and <pre> text."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, tuple[object, str]] = {}
        self.images: list[str] = []
        self.pre = ""
        self._key: str | None = None
        self._in_pre = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "td" and "data-key" in attrs:
            self._key = attrs["data-key"]
            self.cells[self._key] = (json.loads(attrs["data-value"]), "")
        elif tag == "img":
            self.images.append(attrs["src"])
        self._in_pre = tag == "pre"

    def handle_endtag(self, tag):
        self._key = None if tag == "td" else self._key
        self._in_pre = False if tag == "pre" else self._in_pre

    def handle_data(self, data):
        if self._key:
            value, shown = self.cells[self._key]
            self.cells[self._key] = (value, shown + data)
        if self._in_pre:
            self.pre += data


def parse_page(text: str) -> _Cells:
    parser = _Cells()
    parser.feed(text)
    return parser


def test_report_of_a_local_run(tmp_path):
    records = make_records()
    write_run(str(tmp_path), records)
    result = report.run(str(tmp_path))
    assert result.png == str(tmp_path / "report.png")
    assert result.html == str(tmp_path / "report.html")

    image = matplotlib_image.imread(result.png)
    width, height = report.FIGSIZE[0] * report.DPI, report.FIGSIZE[1] * report.DPI
    assert image.shape[:2] == (height, width)
    assert image[..., :3].std() > 0.05  # curves and text, not a blank canvas

    page = parse_page(Path(result.html).read_text(encoding="utf-8"))
    assert page.images == ["data:image/png;base64," + base64.b64encode(
        Path(result.png).read_bytes()).decode()]
    assert page.pre == CONFIG
    assert not [p for p in tmp_path.iterdir() if storage.is_temporary(p.name)]

    # The final figures, computed here from the records independently of the report code.
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    expected = {
        "steps": (STEPS, f"{STEPS:,}"),
        "tokens": (STEPS * BATCH * SEQ, f"{STEPS * BATCH * SEQ:,}"),
        "wall_time": (evals[-1]["time"], "0:08:23"),
        "train_loss": (train[-1]["loss"], f"{train[-1]['loss']:.4f}"),
        "train_accuracy": (train[-1]["accuracy"], f"{100 * train[-1]['accuracy']:.2f}%"),
        "eval_step": (STEPS, f"{STEPS:,}"),
        "eval_loss": (evals[-1]["loss"], f"{evals[-1]['loss']:.4f}"),
        "eval_accuracy": (evals[-1]["accuracy"], f"{100 * evals[-1]['accuracy']:.2f}%"),
        "eval_perplexity": (math.exp(evals[-1]["loss"]), f"{math.exp(evals[-1]['loss']):.2f}"),
    }
    for key, (value, shown) in expected.items():
        assert page.cells[key] == (pytest.approx(value, rel=1e-15), shown), key
    speeds = [4000 + step for step in range(2 * LOG_EVERY, STEPS + 1, LOG_EVERY)]
    mean_speed = sum(speeds) / len(speeds)
    assert page.cells["tokens_per_second"][0] == pytest.approx(mean_speed, rel=1e-12)
    assert page.cells["tokens_per_second"][1] == f"{mean_speed:,.0f}"
    assert result.figures.eval_loss == evals[-1]["loss"]


def test_resumed_run_keeps_the_records_of_the_final_history(tmp_path):
    # Killed after step 250, resumed from the checkpoint at step 200: steps 210-250 come twice.
    first = [r for r in make_records(last=250) if r["step"] <= 250]
    second = make_records(first=210, shift=-0.1)
    records = first + second
    train = report.history(records, "train")
    assert [r["step"] for r in train] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    old_200 = next(r for r in first if r["split"] == "train" and r["step"] == 200)
    assert train[19] is old_200 and train[20] is second[0]  # step 200 old, 210 from the rerun
    evals = report.history(records, "eval")
    assert [r["step"] for r in evals] == [100, 200, 300, 400]
    write_run(str(tmp_path), records, config=None)
    result = report.run(str(tmp_path))
    assert result.figures.train_loss == second[-2]["loss"]  # the last train record of the rerun
    assert f"No {rundir.CONFIG_NAME} in the run dir." in Path(result.html).read_text()


def test_train_only_run_and_lone_record(tmp_path):
    records = [r for r in make_records(last=10) if r["split"] == "train"]
    write_run(str(tmp_path), records)
    result = report.run(str(tmp_path))
    assert result.figures.eval_loss is None and result.figures.tokens_per_second == 800.0
    page = parse_page(Path(result.html).read_text())
    assert page.cells["eval_perplexity"] == (None, "n/a")
    assert matplotlib_image.imread(result.png).shape[0] == report.FIGSIZE[1] * report.DPI


def test_report_of_a_remote_run():
    run_dir = "ram://report-test/run"
    write_run(run_dir, make_records())
    result = report.run(run_dir)
    assert result.png == run_dir + "/report.png"
    assert storage.read_bytes(result.png).startswith(b"\x89PNG\r\n\x1a\n")
    page = parse_page(storage.read_text(result.html))
    assert page.cells["steps"] == (STEPS, f"{STEPS:,}")


def test_unterminated_last_line_of_a_killed_run_is_skipped(tmp_path):
    write_run(str(tmp_path), make_records())
    path = tmp_path / rundir.METRICS_NAME
    with open(path, "a") as f:
        f.write('{"split": "train", "step": 41')
    assert report.read_metrics(str(path)) == make_records()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", r"metrics\.jsonl:3: empty line"),
        ("{not json", r"metrics\.jsonl:3: not valid JSON"),
        ("[1, 2]", r"metrics\.jsonl:3: expected a JSON object, got list"),
        ('{"split": "train", "step": 30, "time": 1, "tokens": 2, "loss": 1}',
         r"metrics\.jsonl:3: train record needs a number 'accuracy', got None"),
        ('{"split": "eval", "step": 30.5, "time": 1, "tokens": 2, "loss": 1, "accuracy": 0.1, '
         '"perplexity": 2.7}', r"metrics\.jsonl:3: 'step' must be an integer"),
    ],
)
def test_bad_lines_are_named_by_file_and_line(tmp_path, line, message):
    good = [json.dumps(r) for r in make_records()[:2]]
    (tmp_path / rundir.METRICS_NAME).write_text("\n".join([*good, line, *good]) + "\n")
    with pytest.raises(TpulmError, match=message):
        report.run(str(tmp_path))


def test_missing_run_dir_metrics_or_records(tmp_path):
    with pytest.raises(TpulmError, match=f"run dir {tmp_path / 'nope'} does not exist"):
        report.run(str(tmp_path / "nope"))
    with pytest.raises(TpulmError, match=r"metrics\.jsonl does not exist: train a model"):
        report.run(str(tmp_path))
    (tmp_path / rundir.METRICS_NAME).write_text('{"split": "other", "step": 1}\n')
    with pytest.raises(TpulmError, match="no train or eval record"):
        report.run(str(tmp_path))


def test_cli(tmp_path, capsys):
    write_run(str(tmp_path), make_records())
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Final eval perplexity" in out and f"wrote {tmp_path / 'report.html'}" in out
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"tpulm: error: run dir {tmp_path / 'missing'} does not exist"
    )


def test_the_title_names_the_command_that_made_the_run(tmp_path):
    records = make_records(last=20)
    write_run(str(tmp_path / "runs" / "tiny"), records)  # as `tpulm train --run-dir runs/tiny`
    alone = report.run(str(tmp_path / "runs" / "tiny"))
    assert f"<h1>tpulm train --run-dir {tmp_path}/runs/tiny</h1>" in Path(alone.html).read_text()
    work = tmp_path / "work"  # as `tpulm run --work-dir work`: its stage records beside the run
    write_run(str(work / "run"), records)
    (work / "stages").mkdir()
    (work / "stages" / "train.json").write_text("{}")
    piped = report.run(str(work / "run"))
    assert f"<h1>tpulm run --work-dir {work}</h1>" in Path(piped.html).read_text()
