"""Benchmark: near-duplicate grouping of 100,000 synthetic queries.

    python benchmarks/bench_grouping.py [--n 100000] [--seed 0] [--exact-check 0]

The queries mix Chinese and English. About 20% are templated near-duplicates
(one of 60 templates with a random order number, tracking id, date, amount,
count and one of 12 products); the rest are distinct sentences drawn from
synthetic vocabularies (2-character Chinese words from ~1,500 common-range
ideographs, English pseudo-words plus a few frequent function words).

Prints a markdown table: machine, command, seconds per stage, groups.
``--exact-check N`` also groups the first N queries with the exact method and
with MinHash and reports whether the partitions agree.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

try:
    from rag_ablate.dataset.grouping.groups import group_near_duplicates
except ImportError:  # running from a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from rag_ablate.dataset.grouping.groups import group_near_duplicates

ZH_TEMPLATES = [
    "订单{order} {date}签收的{product}，现在还能退吗",
    "我的订单{order}怎么还没发货？{date}下的单",
    "快递单号{track}显示{date}已签收但我没收到{product}",
    "{date}买的{product}花了{amount}元，降价了能退差价吗",
    "订单号{order}的{product}少发了{count}件怎么办",
    "请问{product}的发票在哪里开，订单{order}",
    "{product}用了{count}天就坏了，订单{order}可以换新吗",
    "我{date}申请的退款{amount}元什么时候到账",
    "物流单号{track}一直不更新，{date}就发货了",
    "订单{order}能不能改地址？{date}下单的{product}",
    "{product}收到时外包装破损，单号{track}",
    "为什么我的优惠券{coupon}用不了，订单金额{amount}",
    "会员积分{count}分能抵扣多少钱，订单{order}",
    "{date}下的订单{order}能取消吗",
    "退货单{order}寄回去{count}天了还没退款",
    "{product}有没有{count}年保修？{date}买的",
    "我在{date}付了{amount}元但订单{order}显示未支付",
    "预售的{product}{date}能发货吗",
    "订单{order}的赠品没收到，{product}已到",
    "{product}和描述不符，申请退货单号{track}",
    "客服你好，订单{order}里的{product}尺码不对想换",
    "支付了{amount}元的{product}能开增值税专票吗",
    "上次{date}咨询的问题还没解决，工单{order}",
    "快递{track}被别人签收了怎么办",
    "我买了{count}个{product}，能分开寄吗",
    "{date}到货的{product}有划痕，订单{order}",
    "订单{order}的运费{amount}元能退吗",
    "修改手机号后订单{order}收不到验证码",
    "礼品卡{coupon}余额{amount}元怎么查",
    "退款{amount}元原路返回要几天，订单{order}",
]
EN_TEMPLATES = [
    "Where is my order #{order}? It was placed on {date}",
    "My {product} from order {order} arrived broken, can I return it?",
    "Tracking number {track} says delivered on {date} but I have nothing",
    "I was charged ${amount} twice for order {order}",
    "Can I change the shipping address for order #{order}?",
    "How do I return the {product} I bought on {date}?",
    "Refund of ${amount} for order {order} still not received",
    "Order {order} is missing {count} items, what should I do",
    "Is the {product} covered by warranty after {count} years?",
    "The coupon {coupon} does not work on my order of ${amount}",
    "Please cancel order #{order} placed {date}",
    "Package {track} has not moved since {date}",
    "Can I get an invoice for order {order}?",
    "I received the wrong size {product}, order {order}",
    "When will the {product} be back in stock? I asked on {date}",
    "Why was my payment of ${amount} declined for order {order}?",
    "My gift card {coupon} shows a balance of ${amount}, is that right?",
    "Can you ship the {count} {product} in separate packages?",
    "Order {order} shows delivered but the {product} is not here",
    "Do you price match? I paid ${amount} for the {product} on {date}",
    "I need to exchange the {product} from order #{order}",
    "The {product} stopped working after {count} days, order {order}",
    "Support ticket {order} opened on {date} has no answer",
    "How long does a refund of ${amount} take to reach my card?",
    "Someone else signed for package {track}",
    "Can I add {count} more items to order {order}?",
    "The {product} in order {order} has scratches",
    "Shipping fee of ${amount} on order {order} should be free",
    "I cannot log in since {date}, my account email is user{count}@example.com",
    "Is order {order} eligible for free returns?",
]
PRODUCTS_ZH = [
    "耳机", "手机壳", "充电器", "蓝牙音箱", "智能手表", "键盘",
    "鼠标", "显示器", "路由器", "平板", "电饭煲", "空气炸锅",
]  # fmt: skip
PRODUCTS_EN = [
    "headphones", "phone case", "charger", "bluetooth speaker", "smart watch", "keyboard",
    "mouse", "monitor", "router", "tablet", "rice cooker", "air fryer",
]  # fmt: skip
FUNCTION_WORDS = ["how", "do", "i", "my", "the", "is", "can", "what", "a", "to", "of", "for", "it", "why"]


def _date(rng: random.Random, zh: bool) -> str:
    y, m, d = rng.randint(2024, 2027), rng.randint(1, 12), rng.randint(1, 28)
    formats = [f"{y}-{m:02d}-{d:02d}", f"{y}/{m}/{d}", "yesterday" if not zh else "昨天"]
    formats += [f"{m}月{d}日", f"{y}年{m}月{d}日", "上周五"] if zh else [
        f"Nov {d} {y}", f"{d} March {y}", f"{m:02d}/{d:02d}/{y}"]  # fmt: skip
    return rng.choice(formats)


def _fill(template: str, rng: random.Random, zh: bool) -> str:
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    order = rng.choice(
        [
            "".join(rng.choices("0123456789", k=16)),
            rng.choice(letters) + "".join(rng.choices("0123456789", k=rng.randint(5, 9))),
        ]
    )
    return template.format(
        order=order,
        track=rng.choice(["SF", "YT", "JD", "1Z"]) + "".join(rng.choices("0123456789", k=12)),
        date=_date(rng, zh),
        amount=rng.choice([f"{rng.randint(1, 9999)}.{rng.randint(0, 99):02d}", str(rng.randint(1, 5000))]),
        count=rng.randint(1, 12),
        coupon="".join(rng.choices(letters + "0123456789", k=10)),
        product=rng.choice(PRODUCTS_ZH if zh else PRODUCTS_EN),
    )


def make_queries(n: int, seed: int = 0, templated_share: float = 0.2) -> list[str]:
    """n synthetic queries, shuffled: templated near-duplicates plus distinct sentences."""
    rng = random.Random(seed)
    zh_chars = [chr(0x4E00 + i) for i in rng.sample(range(0x9FA5 - 0x4E00), 1500)]
    zh_words = sorted({rng.choice(zh_chars) + rng.choice(zh_chars) for _ in range(4000)})
    syll = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    en_words = sorted({"".join(rng.choices(syll, k=rng.randint(1, 4))) for _ in range(6000)})
    out: list[str] = []
    n_templated = int(n * templated_share)
    for _ in range(n_templated):
        zh = rng.random() < 0.5
        out.append(_fill(rng.choice(ZH_TEMPLATES if zh else EN_TEMPLATES), rng, zh))
    for _ in range(n - n_templated):
        if rng.random() < 0.5:
            sentence = "".join(rng.choices(zh_words, k=rng.randint(4, 12)))
            out.append(sentence + rng.choice(["", "？", "吗", "呢"]))
        else:
            words = [
                rng.choice(FUNCTION_WORDS) if rng.random() < 0.3 else rng.choice(en_words)
                for _ in range(rng.randint(5, 14))
            ]
            out.append(" ".join(words).capitalize() + rng.choice(["?", ".", ""]))
    rng.shuffle(out)
    return out


def _partition(group_of: list[str]) -> set[frozenset[int]]:
    by: dict[str, list[int]] = {}
    for i, g in enumerate(group_of):
        by.setdefault(g, []).append(i)
    return {frozenset(v) for v in by.values()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-check", type=int, default=0, metavar="N")
    args = parser.parse_args()

    t0 = time.perf_counter()
    texts = make_queries(args.n, seed=args.seed)
    t_gen = time.perf_counter() - t0
    result = group_near_duplicates(texts)
    tm = result.timings
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    rows = [
        ("machine", f"{platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs"),
        ("python / numpy", f"{platform.python_version()} / {np.__version__}"),
        ("command", f"`{command}`"),
        ("queries", f"{len(texts):,} (generated in {t_gen:.2f} s, not counted)"),
        ("method", result.method),
        ("normalise + shingle", f"{tm['normalise'] + tm['shingle']:.2f} s "
         f"(normalise {tm['normalise']:.2f}, shingle {tm['shingle']:.2f})"),
        ("MinHash", f"{tm['minhash']:.2f} s"),
        ("LSH + verify", f"{tm['candidates_verify']:.2f} s "
         f"({int(tm['pairs_verified']):,} pairs verified, {int(tm['pairs_accepted']):,} accepted)"),
        ("union-find", f"{tm['union_find']:.3f} s"),
        ("total", f"{tm['total']:.2f} s"),
        ("groups", f"{result.n_groups:,}; largest: "
         + ", ".join(f"{g} ({s})" for g, s in result.largest(3))),
    ]  # fmt: skip
    if args.exact_check:
        sub = texts[: args.exact_check]
        exact = group_near_duplicates(sub, exact_limit=len(sub))
        mh = group_near_duplicates(sub, exact_limit=0)
        same = _partition(exact.group_of) == _partition(mh.group_of)
        rows.append(
            (
                f"exact vs MinHash, first {len(sub):,}",
                f"{'same' if same else 'DIFFERENT'} partition; exact {exact.timings['total']:.2f} s, "
                f"minhash {mh.timings['total']:.2f} s",
            )
        )
    print("| item | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
