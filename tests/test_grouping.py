"""rag_ablate.dataset.grouping: normalisation, the similarity join, near-duplicate groups, splits."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_ablate.core.errors import ConfigError, DatasetError
from rag_ablate.dataset.grouping.groups import GroupingResult, group_near_duplicates
from rag_ablate.dataset.grouping.join import components, shingle
from rag_ablate.dataset.grouping.normalize import MASKS, char_ngrams, normalize, normalize_many
from rag_ablate.dataset.grouping.splits import assign_splits, check_splits

DATE, NUM = MASKS["date"], MASKS["number"]


# ---------------------------------------------------------------- helpers


def partition(group_of: list[str]) -> set[frozenset[int]]:
    by: dict[str, set[int]] = {}
    for i, g in enumerate(group_of):
        by.setdefault(g, set()).add(i)
    return {frozenset(v) for v in by.values()}


def brute_force(texts: list[str], threshold: float = 0.7, n: int = 4) -> set[frozenset[int]]:
    """Reference: every pair, exact Jaccard as a fraction, then transitive closure."""
    sets = [char_ngrams(t, n) for t in texts]
    parent = list(range(len(texts)))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    limit = Fraction(threshold) - Fraction(1, 10**9)
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            inter = len(sets[i] & sets[j])
            if inter and Fraction(inter, len(sets[i] | sets[j])) >= limit:
                parent[find(j)] = find(i)
    return partition([str(find(i)) for i in range(len(texts))])


def same_group(result: GroupingResult, i: int, j: int) -> bool:
    return result.group_of[i] == result.group_of[j]


ZH_TEMPLATES = [
    "订单{order} {date}签收的{product}，现在还能退吗",
    "我的订单{order}怎么还没发货？{date}下的单",
    "快递单号{track}显示{date}已签收但我没收到{product}",
    "{date}买的{product}花了{amount}元，降价了能退差价吗",
    "订单号{order}的{product}少发了{count}件怎么办",
    "{product}用了{count}天就坏了，订单{order}可以换新吗",
    "我{date}申请的退款{amount}元什么时候到账",
    "订单{order}能不能改地址？{date}下单的{product}",
]
EN_TEMPLATES = [
    "Where is my order #{order}? It was placed on {date}",
    "My {product} from order {order} arrived broken, can I return it?",
    "Tracking number {track} says delivered on {date} but I have nothing",
    "I was charged ${amount} twice for order {order}",
    "How do I return the {product} I bought on {date}?",
    "Refund of ${amount} for order {order} still not received",
    "Order {order} is missing {count} items, what should I do",
    "The coupon {coupon} does not work on my order of ${amount}",
]
PRODUCTS_ZH = ["耳机", "手机壳", "充电器", "蓝牙音箱", "智能手表", "键盘", "鼠标", "显示器"]
PRODUCTS_EN = ["headphones", "phone case", "charger", "speaker", "smart watch", "keyboard", "mouse"]


def fill(template: str, rng: random.Random, zh: bool) -> str:
    y, m, d = rng.randint(2024, 2027), rng.randint(1, 12), rng.randint(1, 28)
    dates = [f"{y}-{m:02d}-{d:02d}", f"{y}/{m}/{d}"]
    dates += [f"{m}月{d}日", f"{y}年{m}月{d}日", "昨天", "上周五"] if zh else [f"Nov {d} {y}", "yesterday"]
    digits = "0123456789"
    return template.format(
        order=rng.choice(["".join(rng.choices(digits, k=16)), "A" + "".join(rng.choices(digits, k=6))]),
        track="SF" + "".join(rng.choices(digits, k=12)),
        date=rng.choice(dates),
        amount=rng.choice([f"{rng.randint(1, 999)}.{rng.randint(0, 99):02d}", str(rng.randint(1, 5000))]),
        count=rng.randint(1, 9),
        coupon="".join(rng.choices("ABCDEFGH" + digits, k=10)),
        product=rng.choice(PRODUCTS_ZH if zh else PRODUCTS_EN),
    )


def synthetic(n: int, seed: int, templated_share: float = 0.3) -> list[str]:
    """Templated near-duplicates plus random distinct sentences, in Chinese and English."""
    rng = random.Random(seed)
    zh_chars = [chr(0x4E00 + i) for i in rng.sample(range(20000), 800)]
    zh_words = [rng.choice(zh_chars) + rng.choice(zh_chars) for _ in range(2000)]
    syllables = [c + v for c in "bdfgklmnprstvz" for v in ("a", "e", "i", "o", "u", "ou")]
    en_words = ["".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(2000)]
    common = ["how", "do", "i", "my", "the", "is", "can", "what", "to"]
    out = []
    for _ in range(int(n * templated_share)):
        zh = rng.random() < 0.5
        out.append(fill(rng.choice(ZH_TEMPLATES if zh else EN_TEMPLATES), rng, zh))
    while len(out) < n:
        if rng.random() < 0.5:
            out.append("".join(rng.choices(zh_words, k=rng.randint(3, 10))) + rng.choice(["", "？", "吗"]))
        else:
            k = rng.randint(4, 12)
            words = [rng.choice(common) if rng.random() < 0.3 else rng.choice(en_words) for _ in range(k)]
            out.append(" ".join(words).capitalize() + "?")
    rng.shuffle(out)
    return out


# ---------------------------------------------------------------- normalize


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "订单2026110312345678 昨天签收的耳机，现在还能退吗",
            "订单2026110399999999 11月5日签收的耳机，现在还能退吗",
        ),
        (
            "订单2026110312345678 昨天签收的耳机，现在还能退吗",
            "订单 SF1234567890，2026年11月3日签收的耳机。现在还能退吗？",
        ),
        ("Where is my order #A12345?", "Where is my order #B99881?"),
        ("I was charged $19.99 twice", "i was charged $1,250.00 twice!"),
        ("Delivered on Nov 3 2026?", "delivered on 2026-11-03"),
        ("Delivered on 3rd of November", "Delivered on 03/11/2026"),
        ("包裹11月3号到的", "包裹2026/11/03到的"),
        ("mail a@b.com please", "mail someone.else+x@example.co.uk please"),
        ("see https://shop.example.com/a?b=1 now", "see www.example.org/help now"),
        ("id 123e4567-e89b-12d3-a456-426614174000", "ID 00000000-0000-0000-0000-00000000ABCD"),
        ("ＷＨＥＲＥ　ＩＳ　１２３", "where is 7"),
        ("我买了三个，两天前到的", "我买了5个，3天前到的"),
        ("【耳机】能退吗？！", "耳机 能退吗"),
        ("Straße", "STRASSE"),
    ],
)
def test_normalize_equal(a: str, b: str) -> None:
    assert normalize(a) == normalize(b)


def test_normalize_examples() -> None:
    zh = "订单2026110312345678 昨天签收的耳机，现在还能退吗？"
    assert normalize(zh) == f"订单{NUM}{DATE}签收的耳机现在还能退吗"
    assert normalize("Where is my order #A12345?") == f"where is my order {NUM}"
    assert normalize("3.5 kg, 21st, iPhone15") == f"{NUM} kg {NUM} iphone{NUM}"
    assert normalize("") == ""
    assert normalize("？！。、") == ""
    # different questions stay different
    assert normalize("耳机能退吗") != normalize("耳机保修多久")
    # "may" is a month only with a year
    assert normalize("I may 3 times") == f"i may {NUM} times"
    assert normalize("May 3 2026") == DATE


@pytest.mark.parametrize(
    "date",
    ["2026-11-03", "2026/11/03", "2026.11.3", "11月3日", "2026年11月3日", "Nov 3 2026", "November 3rd, 2026",
     "3 Nov 2026", "03/11/2026", "14:30", "3pm", "昨天", "下周一", "yesterday", "next week"],
)  # fmt: skip
def test_dates_masked(date: str) -> None:
    assert normalize(f"x {date} y") in {f"x {DATE} y", f"x{DATE}y"}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("mail someone.else+x@example.co.uk now", "email"),
        ("see https://shop.example.com/a?b=1 now", "url"),
        ("see www.example.org/help now", "url"),
        ("id 123e4567-e89b-12d3-a456-426614174000 now", "uuid"),
        ("on 2026年11月3日 now", "date"),
        ("on next week now", "date"),
        ("id SF1234567890 now", "number"),
        ("paid 1,299.00 now", "number"),
    ],
)
def test_each_mask_kind_has_its_placeholder(text: str, kind: str) -> None:
    """One masked span becomes exactly its kind's placeholder, the words around it stay."""
    assert normalize(text) == f"{text.split()[0]} {MASKS[kind]} now"


def test_punctuation_stripped_as_by_a_pattern_keeping_every_mark() -> None:
    """The stripper lists only the combining marks of the text it strips: on a text holding every
    code point it strips what the pattern keeping every mark Unicode has strips."""
    import re
    import sys
    import unicodedata

    from rag_ablate.dataset.grouping import normalize as norm

    every = "".join(chr(cp) for cp in range(sys.maxunicode + 1) if not 0xD800 <= cp < 0xE000)
    marks = "".join(re.escape(ch) for ch in every if unicodedata.category(ch)[0] == "M")
    reference = re.compile(rf"[^\w\s{marks}{norm._PLACEHOLDERS}{norm._SEP}]+|_+")
    assert norm._stripper(every).sub(" ", every) == reference.sub(" ", every)
    assert norm._stripper("a\u0301_b-c").sub(" ", "a\u0301_b-c") == "a\u0301 b c"


def test_char_ngrams() -> None:
    assert char_ngrams("abcdef") == {"abcd", "bcde", "cdef"}
    assert char_ngrams("退货") == {"退货"}
    assert char_ngrams("") == {""}
    assert char_ngrams("Abc!", n=2) == {"ab", "bc"}
    assert char_ngrams("订单123能退吗") == char_ngrams(normalize("订单123能退吗"))
    with pytest.raises(ConfigError):
        char_ngrams("x", n=0)


def test_internal_shingles_match_char_ngrams() -> None:
    texts = ["", "a", "退货", "abc", "abcd", "abcdabcd", "订单⌗能退吗", "where is my order ⌗", "aaaaaa"]
    for n in (1, 2, 4, 5):
        sh = shingle(normalize_many(texts), n)
        assert sh.lengths.tolist() == [len(char_ngrams(t, n)) for t in texts]
        grams = [set(sh.indices[sh.indptr[i] : sh.indptr[i + 1]].tolist()) for i in range(len(texts))]
        for i in range(len(texts)):
            for j in range(len(texts)):
                assert len(grams[i] & grams[j]) == len(char_ngrams(texts[i], n) & char_ngrams(texts[j], n))


def test_batch_normalize_equals_single() -> None:
    texts = [*synthetic(300, seed=3), "a\x00b", "", " ", "订单\x00123"]
    assert normalize_many(texts) == [normalize(t) for t in texts]


# ---------------------------------------------------------------- grouping: examples


def test_hand_made_groups() -> None:
    texts = [
        "订单2026110312345678 昨天签收的耳机，现在还能退吗",  # 0
        "订单2026110399999999 11月5日签收的耳机，现在还能退吗",  # 1  same template
        "Where is my order #A12345?",  # 2
        "Where is my order #B99881?",  # 3  same template
        "耳机能退吗",  # 4
        "耳机保修多久",  # 5
        "I was charged $19.99 twice for order 123456",  # 6
        "I was charged $250 twice for order 987654",  # 7  same template
        "How do I reset my password?",  # 8
        "How do I change my email address?",  # 9
    ]
    for exact_limit in (2_000, 0):
        r = group_near_duplicates(texts, exact_limit=exact_limit)
        assert r.method == ("exact" if exact_limit else "minhash")
        assert same_group(r, 0, 1)
        assert same_group(r, 2, 3)
        assert same_group(r, 6, 7)
        assert not same_group(r, 4, 5)
        assert not same_group(r, 8, 9)
        assert not same_group(r, 0, 4)
        assert r.n_groups == 7
        assert r.group_of[:4] == ["g:0", "g:0", "g:2", "g:2"]


def test_short_questions_do_not_collapse() -> None:
    texts = ["退货", "换货", "发票", "运费", "你好", "谢谢", "hi", "ok"]
    texts += ["退款吗", "退货吗", "耳机能退吗", "耳机能修吗"]
    r = group_near_duplicates(texts)
    assert r.n_groups == len(texts)
    # identical short texts (after normalisation) do group
    r = group_near_duplicates(["退货", "退货！", "退 货", "换货"])
    assert r.group_of == ["g:0", "g:0", "g:0", "g:3"]


def test_group_ids_readable_and_stable() -> None:
    texts = ["Where is my order #1111?", "refund please", "Where is my order #2222?"]
    r = group_near_duplicates(texts, ids=["q7", "q8", "q9"])
    assert r.group_of == ["g:q7", "g:q8", "g:q7"]
    assert r.sizes == {"g:q7": 2, "g:q8": 1}
    assert r.largest() == [("g:q7", 2), ("g:q8", 1)]
    assert r.largest(1) == [("g:q7", 2)]
    assert r.largest(0) == []
    again = group_near_duplicates(texts, ids=["q7", "q8", "q9"])
    assert again == r


def test_explicit_groups_win_and_are_never_merged() -> None:
    texts = [
        "Where is my order #1111?",  # 0 explicit A
        "Where is my order #2222?",  # 1 no explicit group: near-duplicate of 0, not merged into A
        "Where is my order #3333?",  # 2 no explicit group: groups with 1
        "Where is my order #4444?",  # 3 explicit B: not merged with A although identical after masks
        "totally different",  # 4 explicit A: explicit wins over the text
    ]
    explicit = ["A", None, None, "B", "A"]
    r = group_near_duplicates(texts, explicit=explicit)
    assert r.group_of == ["A", "g:1", "g:1", "B", "A"]
    assert r.sizes == {"A": 2, "g:1": 2, "B": 1}
    assert r.n_groups == 3


def test_computed_id_never_collides_with_explicit() -> None:
    r = group_near_duplicates(["x y z w", "something else"], ids=["a", "b"], explicit=[None, "g:a"])
    assert r.group_of == ["g:a~2", "g:a"]
    r = group_near_duplicates(["p", "q"], explicit=["X", "X"])
    assert r.group_of == ["X", "X"]
    assert r.method == "exact"


def test_errors() -> None:
    with pytest.raises(DatasetError, match="duplicate query id 'q1'"):
        group_near_duplicates(["a", "b"], ids=["q1", "q1"])
    with pytest.raises(ValueError):
        group_near_duplicates(["a", "b"], ids=["q1"])
    with pytest.raises(ValueError):
        group_near_duplicates(["a", "b"], explicit=[None])
    for kwargs in ({"threshold": 0.0}, {"threshold": 1.5}, {"n": 0}, {"exact_limit": -1}, {"num_perm": 0}):
        with pytest.raises(ConfigError):
            group_near_duplicates(["a"], **kwargs)


def test_empty_input() -> None:
    r = group_near_duplicates([])
    assert r.group_of == [] and r.n_groups == 0 and r.sizes == {}


def test_threshold_one_groups_only_identical_gram_sets() -> None:
    texts = ["Where is my order #1?", "where is my order 22", "Where is my parcel #1?"]
    r = group_near_duplicates(texts, threshold=1.0)
    assert r.group_of == ["g:0", "g:0", "g:2"]


# ---------------------------------------------------------------- exact vs MinHash


def test_exact_path_equals_brute_force() -> None:
    texts = synthetic(400, seed=11, templated_share=0.5)
    for threshold in (0.5, 0.7, 0.9):
        r = group_near_duplicates(texts, threshold=threshold, exact_limit=10_000)
        assert r.method == "exact"
        assert partition(r.group_of) == brute_force(texts, threshold)


def gram_set(text: str, n: int) -> frozenset[str]:
    """Reference n-gram set of an already normalised text (the text itself when shorter than n)."""
    if len(text) < n:
        return frozenset([text])
    return frozenset(text[i : i + n] for i in range(len(text) - n + 1))


def brute_force_components(texts: list[str], threshold: float, n: int) -> set[frozenset[int]]:
    """Reference for the join alone: exact Jaccard of every pair as a fraction, then components."""
    sets = [gram_set(t, n) for t in texts]
    label = list(range(len(texts)))
    limit = Fraction(threshold) - Fraction(1, 10**9)
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            inter = len(sets[i] & sets[j])
            if inter and Fraction(inter, len(sets[i] | sets[j])) >= limit:
                old, new = max(label[i], label[j]), min(label[i], label[j])
                label = [new if x == old else x for x in label]
    return partition([str(x) for x in label])


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.text(alphabet="abc⌗", max_size=9), max_size=25),
    st.sampled_from([0.3, 0.5, 0.7, 0.8, 1.0]),
    st.integers(1, 4),
    st.integers(0, 3),
)
def test_join_equals_brute_force_jaccard(texts: list[str], threshold: float, n: int, seed: int) -> None:
    """join.components on normalised texts: the exact path is the brute-force partition; the
    MinHash path never joins texts the brute force keeps apart (it can only miss a link)."""
    reference = brute_force_components(texts, threshold, n)
    exact, method = components(
        texts, threshold=threshold, n=n, exact_limit=10_000, num_perm=128, seed=seed, timings={}
    )
    assert method == "exact"
    assert partition([str(x) for x in exact]) == reference
    approx, method = components(
        texts, threshold=threshold, n=n, exact_limit=0, num_perm=128, seed=seed, timings={}
    )
    assert method == ("minhash" if texts else "exact")
    for part in partition([str(x) for x in approx]):
        assert any(part <= ref for ref in reference)


@pytest.mark.parametrize("seed", [0, 1])
def test_minhash_agrees_with_exact_on_synthetic_set(seed: int) -> None:
    texts = synthetic(3_000, seed=seed)
    exact = group_near_duplicates(texts, exact_limit=10_000)
    minhash = group_near_duplicates(texts, exact_limit=0, seed=seed)
    assert exact.method == "exact" and minhash.method == "minhash"
    assert exact.n_groups < 2_500  # the templates did group
    assert partition(minhash.group_of) == partition(exact.group_of)


def test_minhash_near_threshold_miss_rate_is_small() -> None:
    """Isolated pairs right at the threshold are the hardest case for LSH.

    The documented tolerance: with 128 permutations and t = 0.7 (32 bands of
    4 rows) a pair at exactly J = 0.7 is missed with probability 1.5e-4 (at
    J = 0.72: 5e-5). Here 1,000 isolated pairs with J in [0.69, 0.76] (one
    substituted character in 25-32 characters) may miss at most 1% of the
    exact pairs, and MinHash never adds a pair the exact path rejects.
    """
    rng = random.Random(5)
    alphabet = [chr(0x4E00 + i) for i in range(5000)]
    texts = []
    for _ in range(1_000):
        base = rng.choices(alphabet, k=rng.randint(25, 32))
        variant = list(base)
        variant[rng.randrange(4, len(base) - 4)] = rng.choice(alphabet)
        texts += ["".join(base), "".join(variant)]
    exact = partition(group_near_duplicates(texts, exact_limit=10_000).group_of)
    minhash = partition(group_near_duplicates(texts, exact_limit=0).group_of)
    exact_pairs = {p for p in exact if len(p) == 2}
    minhash_pairs = {p for p in minhash if len(p) == 2}
    assert all(len(p) <= 2 for p in exact | minhash)
    assert minhash_pairs <= exact_pairs
    assert len(exact_pairs) > 500
    assert len(exact_pairs - minhash_pairs) <= 0.01 * len(exact_pairs)


def test_minhash_is_deterministic() -> None:
    texts = synthetic(1_000, seed=4)
    a = group_near_duplicates(texts, exact_limit=0, seed=7)
    b = group_near_duplicates(texts, exact_limit=0, seed=7)
    assert a == b


def test_large_bucket_of_near_identical_texts() -> None:
    """Many distinct variants of one template: connected without verifying all pairs."""
    rng = random.Random(2)
    names = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=6)) for _ in range(1500)]
    texts = [f"I would like to return the {name} that I bought last month, is that ok" for name in names]
    r = group_near_duplicates(texts, exact_limit=0)
    assert r.n_groups == 1
    assert r.timings["pairs_verified"] < 50_000  # all pairs would be 1,124,250
    r = group_near_duplicates(texts, exact_limit=10_000)
    assert r.n_groups == 1


# ---------------------------------------------------------------- splits


def template_heavy_groups(n: int = 1_000, seed: int = 0) -> list[str]:
    """One template holds 10% of the queries, a few smaller ones, the rest singletons."""
    rng = random.Random(seed)
    sizes = [n // 10, 30, 20, 12, 8, 5, 5, 3, 3, 2, 2]
    group_of = [f"t{k}" for k, s in enumerate(sizes) for _ in range(s)]
    group_of += [f"s{i}" for i in range(n - len(group_of))]
    rng.shuffle(group_of)
    return group_of


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("share", [0.2, 0.3, 0.5])
def test_assign_splits_share_and_whole_groups(seed: int, share: float) -> None:
    group_of = template_heavy_groups(seed=seed)
    split = assign_splits(group_of, holdout_share=share, seed=seed)
    assert set(split) <= {"dev", "holdout"}
    assert check_splits(group_of, split) == []
    assert abs(split.count("holdout") / len(split) - share) <= 0.005


def test_assign_splits_deterministic_and_seeded() -> None:
    group_of = template_heavy_groups()
    a = assign_splits(group_of, seed=1)
    assert a == assign_splits(list(group_of), seed=1)
    assert a != assign_splits(group_of, seed=2)


def test_assign_splits_fixed() -> None:
    group_of = ["a", "a", "a", "b", "b", "c", "d", "e", "f", "g"]
    fixed: list[str | None] = [None, "holdout", None, None, None, "dev", None, None, None, None]
    split = assign_splits(group_of, fixed=fixed, holdout_share=0.3)
    assert split[:3] == ["holdout"] * 3
    assert split[5] == "dev"
    assert check_splits(group_of, split) == []
    assert split.count("holdout") == 3  # group a already fills the target


def test_assign_splits_worked_example() -> None:
    """Hand computation: n = 12, share 0.3 -> targets holdout 3.6, dev 8.4; group h (2) is fixed.

    Then largest first, each into the split with the smaller filled fraction:
    a (5): holdout 2/3.6 = 0.56 > dev 0/8.4 -> dev; b (3): 0.56 < 5/8.4 = 0.60 -> holdout;
    c, d (1 each): holdout 5/3.6 = 1.39 > dev 0.60, 0.71 -> dev. Holdout 5, dev 7.
    """
    group_of = ["a"] * 5 + ["b"] * 3 + ["h"] * 2 + ["c", "d"]
    fixed: list[str | None] = [None] * 8 + ["holdout", None, None, None]
    split = assign_splits(group_of, holdout_share=0.3, fixed=fixed)
    assert split == ["dev"] * 5 + ["holdout"] * 3 + ["holdout"] * 2 + ["dev", "dev"]


def test_assign_splits_fixed_conflict() -> None:
    with pytest.raises(DatasetError, match="group 'a' is fixed to both splits"):
        assign_splits(["a", "b", "a"], fixed=["dev", None, "holdout"])
    with pytest.raises(DatasetError, match="split must be"):
        assign_splits(["a"], fixed=["test"])
    with pytest.raises(ConfigError):
        assign_splits(["a"], holdout_share=1.2)
    with pytest.raises(ValueError):
        assign_splits(["a"], fixed=[])


def test_assign_splits_extremes() -> None:
    group_of = ["a", "a", "b", "c"]
    assert assign_splits(group_of, holdout_share=0.0) == ["dev"] * 4
    assert assign_splits(group_of, holdout_share=1.0) == ["holdout"] * 4
    assert assign_splits([]) == []


def test_check_splits() -> None:
    assert check_splits(["a", "a", "b", "c", "c"], ["dev", "holdout", "dev", "holdout", "dev"]) == ["a", "c"]
    assert check_splits(["a", "a"], ["dev", "dev"]) == []
    with pytest.raises(ValueError):
        check_splits(["a"], [])


def test_grouping_then_splits_end_to_end() -> None:
    texts = synthetic(2_000, seed=9, templated_share=0.4)
    r = group_near_duplicates(texts)
    split = assign_splits(r.group_of, holdout_share=0.3)
    assert check_splits(r.group_of, split) == []
    assert abs(split.count("holdout") / len(split) - 0.3) <= 0.01


# ---------------------------------------------------------------- properties

NASTY = [
    *"abcxyz 0123456789-./:@#_,，。？！、【】年月日号天今昨前周一二三两个件订单耳机かが\u3099\u0301éİßﬁ①½²¨",
    *"\u00a0\u3000\t\n\x00⌗◷✉⌘◈ＡＢ１２$¥%",
    *["www.", "https://", "may ", "nov ", "pm", "yesterday", "下周", "2026-11-03"],
]
nasty_text = st.lists(st.sampled_from(NASTY), max_size=25).map("".join)
any_text = st.one_of(st.text(max_size=30), nasty_text)


@settings(max_examples=600, deadline=None)
@given(any_text)
def test_normalize_idempotent(text: str) -> None:
    once = normalize(text)
    assert normalize(once) == once
    assert char_ngrams(once) == char_ngrams(text)


TEMPLATED = [
    fill(t, random.Random(i), zh)
    for i in range(40)
    for zh, ts in ((True, ZH_TEMPLATES), (False, EN_TEMPLATES))
    for t in ts[:3]
]
query_text = st.one_of(st.sampled_from(TEMPLATED), any_text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(query_text, max_size=40), st.randoms(use_true_random=False), st.booleans())
def test_grouping_invariant_to_order(texts: list[str], rnd: random.Random, use_minhash: bool) -> None:
    limit = 0 if use_minhash else 10_000
    order = list(range(len(texts)))
    rnd.shuffle(order)
    a = group_near_duplicates(texts, exact_limit=limit)
    b = group_near_duplicates([texts[i] for i in order], exact_limit=limit)
    back = [""] * len(texts)
    for pos, i in enumerate(order):
        back[i] = b.group_of[pos]
    assert partition(back) == partition(a.group_of)
    # every item gets a group
    assert len(a.group_of) == len(texts) and all(a.group_of)
    assert sum(a.sizes.values()) == len(texts) == len(texts)
    assert a.n_groups == len(set(a.group_of)) == len(a.sizes)
    if not use_minhash:
        assert partition(a.group_of) == brute_force(texts)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(query_text, st.one_of(st.none(), st.sampled_from(["A", "B", "g:0"]))), max_size=30),
    st.booleans(),
)
def test_explicit_items_keep_their_group(items: list[tuple[str, str | None]], use_minhash: bool) -> None:
    texts = [t for t, _ in items]
    explicit = [g for _, g in items]
    r = group_near_duplicates(texts, explicit=explicit, exact_limit=0 if use_minhash else 10_000)
    for g, e in zip(r.group_of, explicit, strict=True):
        if e is not None:
            assert g == e
        else:
            assert g.startswith("g:") and g not in explicit


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 30), max_size=200),
    st.floats(0.0, 1.0),
    st.integers(0, 3),
    st.lists(st.sampled_from([None, None, None, "dev", "holdout"]), max_size=200),
)
def test_assign_splits_properties(groups: list[int], share: float, seed: int, fix: list[str | None]) -> None:
    group_of = [f"g{g}" for g in groups]
    fixed = (fix + [None] * len(group_of))[: len(group_of)]
    first: dict[str, str] = {}
    conflict = any(first.setdefault(g, s) != s for g, s in zip(group_of, fixed, strict=True) if s is not None)
    if conflict:
        with pytest.raises(DatasetError):
            assign_splits(group_of, holdout_share=share, seed=seed, fixed=fixed)
        return
    split = assign_splits(group_of, holdout_share=share, seed=seed, fixed=fixed)
    assert len(split) == len(group_of)
    assert check_splits(group_of, split) == []
    for s, f in zip(split, fixed, strict=True):
        assert f is None or s == f
    if not any(fixed) and group_of:
        # greedy error is at most the largest group
        largest = max(Counter(group_of).values())
        assert abs(split.count("holdout") - share * len(group_of)) <= largest
