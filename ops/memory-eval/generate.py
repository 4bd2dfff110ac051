#!/usr/bin/env python3
"""kvmem's own retrieval evaluation set: multi-session conversations authored from templates
(people, places, plans, dates), with questions annotated with the message ids that hold the
answer. Question types: single (words shared), paraphrase (no content word shared with the
evidence), multihop (two facts in different sessions) and temporal (a month named in the
question). Deterministic for a given --seed. Writes chats.jsonl and questions.jsonl."""
import argparse, datetime as dt, json, random

NAMES = ["Ana", "Raj", "Lena", "Tomas", "Priya", "Marco", "Yuki", "Omar", "Ines", "Jonah",
         "Sofia", "Kwame", "Mei", "Pablo", "Greta", "Idris", "Nora", "Felix", "Zara", "Luca",
         "Hana", "Viktor", "Amara", "Diego", "Elif", "Sven", "Leila", "Mateo", "Chen", "Rosa"]
RELATIONS = ["sister", "brother", "cousin", "coworker", "neighbor", "uncle", "aunt", "best friend"]
CITIES = ["Porto", "Toronto", "Kyoto", "Nairobi", "Lyon", "Denver", "Krakow", "Melbourne",
          "Bergen", "Valparaiso", "Tallinn", "Seville", "Osaka", "Halifax", "Tucson", "Ghent"]
GIFTS = ["vintage guitar", "leather journal", "telescope", "espresso machine", "chess set",
         "hand-knit scarf", "pocket watch", "bonsai tree", "record player", "fountain pen"]
EVENTS = [("charity gala", "the old train station"), ("book fair", "the riverside pavilion"),
          ("wedding", "a vineyard outside town"), ("reunion", "the lakeside lodge"),
          ("film screening", "the rooftop cinema"), ("chili cook-off", "the community hall")]
# (statement, paraphrased question sharing no content word with it)
PARAPHRASE = [
    ("I adopted a beagle puppy and named him Biscuit.", "Which new animal joined my household?"),
    ("I just started taking cello lessons on Thursdays.", "What musical instrument am I practicing?"),
    ("My doctor told me to cut out gluten completely.", "What dietary restriction was I given?"),
    ("We finally closed on the apartment near the harbor.", "Where did I buy property?"),
    ("I got promoted to team lead last Friday.", "What career advancement did I receive?"),
    ("I finished my first half marathon in under two hours!", "Which race did I complete?"),
    ("The transmission on my car died on the highway.", "What went wrong with my vehicle?"),
    ("I've been binge-reading Scandinavian crime novels.", "What sort of books have I been into?"),
    ("My landlord is raising the rent by twenty percent.", "Why might my housing costs go up?"),
    ("I signed up for a pottery class at the art center.", "What craft hobby did I pick up?"),
    ("I'm allergic to shellfish, shrimp makes me break out in hives.", "Which foods trigger a reaction for me?"),
    ("We're planning to repaint the nursery pale yellow.", "What color will the baby's room be?"),
    ("I quit coffee three weeks ago and the headaches are finally gone.", "Which beverage did I give up?"),
    ("My laptop screen cracked when it fell off the desk.", "What happened to my computer?"),
    ("I'm training for my scuba certification in the spring.", "What diving qualification am I pursuing?"),
    ("Our basement flooded after the storm.", "What water damage did the house suffer?"),
    ("I volunteer at the animal shelter every Sunday morning.", "Where do I donate my time on weekends?"),
    ("I got braces at thirty-four, feels ridiculous.", "What orthodontic treatment did I start?"),
    ("I've switched to a standing desk for my back.", "What change did I make to my workstation?"),
    ("My grandmother taught me her dumpling recipe.", "Which family dish did I learn to cook?"),
    ("I failed the driving test because of parallel parking.", "Why didn't I get my license?"),
    ("I'm learning Portuguese with an app every night.", "Which language am I studying?"),
    ("We booked a cabin in the mountains for the holidays.", "Where are we staying over the festive season?"),
    ("My knee surgery is scheduled for next month.", "What medical procedure is coming up?"),
]
ACTIVITIES = ["went kayaking on the bay", "took a pottery workshop", "hiked to the glacier viewpoint",
              "ran a charity 10k", "visited the modern art museum", "went to a jazz concert",
              "tried indoor rock climbing", "spent the day at a wine tasting", "went to a comedy show",
              "learned to make sushi at a cooking class", "went horseback riding", "saw a ballet"]
FILLER_USER = ["How was your day?", "Pretty busy today, lots of meetings.", "I need more coffee honestly.",
               "The weather has been so gloomy lately.", "Did you watch anything good recently?",
               "I'm so tired, I barely slept.", "Work is fine, nothing special.", "Just got home, long commute.",
               "I should really clean the kitchen.", "Thinking about ordering pizza tonight.",
               "My phone keeps freezing, so annoying.", "The traffic this morning was unreal.",
               "I finally caught up on emails.", "Weekend plans are still up in the air.",
               "I tried a new recipe but it was just okay.", "Feeling a bit better than yesterday.",
               "My friend said the new cafe downtown is nice.", "I keep forgetting to water the plants."]
FILLER_BOT = ["That sounds like a lot, how are you holding up?", "Ha, I hear you.", "Tell me more about that!",
              "That's good to hear.", "Oh no, that sounds frustrating.", "What are you thinking of doing?",
              "Sounds relaxing, honestly.", "I hope tomorrow is calmer for you.", "Nice, anything else new?",
              "That makes sense.", "Oof, I'm sorry.", "Good call."]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]


def build_user(rng, uid, start):
    me = rng.choice(NAMES)
    others = rng.sample([n for n in NAMES if n != me], 8)
    rels = rng.sample(RELATIONS, 4)
    n_sessions = rng.randint(18, 26)
    # Session dates: every 5-15 days.
    dates, d = [], start
    for _ in range(n_sessions):
        d = d + dt.timedelta(days=rng.randint(5, 15), hours=rng.randint(0, 10))
        dates.append(d)
    sessions = [[] for _ in range(n_sessions)]  # lists of (speaker, text, tag)
    questions = []

    def place(s, speaker, text, tag=None):
        sessions[s].append((speaker, text, tag))

    # Paraphrase facts (+ a few asked with shared words).
    facts = rng.sample(PARAPHRASE, 8)
    for k, (stmt, q) in enumerate(facts):
        s = rng.randrange(n_sessions)
        tag = f"para{k}"
        place(s, me, stmt, tag)
        questions.append({"type": "paraphrase", "question": q, "tags": [tag]})
    # Single-hop with shared words: where a person lives / works.
    for k in range(3):
        who, rel, city = others[k], rels[k], rng.choice(CITIES)
        s = rng.randrange(n_sessions)
        tag = f"single{k}"
        place(s, me, f"My {rel} {who} just moved to {city} for a new job.", tag)
        questions.append({"type": "single", "question": f"Where did my {rel} {who} move to?", "tags": [tag]})
    # Multi-hop: gift giver -> city; organiser -> venue.
    gift_giver, gift = others[3], rng.choice(GIFTS)
    s1, s2 = sorted(rng.sample(range(n_sessions), 2))
    city2 = rng.choice(CITIES)
    place(s1, me, f"{gift_giver} gave me a {gift} for my birthday, I love it.", "hopA1")
    place(s2, me, f"{gift_giver} told me she is relocating to {city2} next spring.", "hopA2")
    questions.append({"type": "multihop", "question": f"Which city is the person who gave me the {gift} moving to?",
                      "tags": ["hopA1", "hopA2"]})
    org, (event, venue) = others[4], rng.choice(EVENTS)
    s1, s2 = sorted(rng.sample(range(n_sessions), 2))
    place(s1, me, f"My {rels[3]} {org} is organizing the {event} this year.", "hopB1")
    place(s2, me, f"Apparently the {event} will be held at {venue}.", "hopB2")
    questions.append({"type": "multihop", "question": f"Where will the event that my {rels[3]} is organizing take place?",
                      "tags": ["hopB1", "hopB2"]})
    # Temporal: one activity per chosen session, asked by month.
    acts = rng.sample(ACTIVITIES, 5)
    used_months = set()
    for k, act in enumerate(acts):
        for _ in range(20):
            s = rng.randrange(n_sessions)
            ym = (dates[s].year, dates[s].month)
            if ym not in used_months:
                break
        used_months.add(ym)
        tag = f"time{k}"
        place(s, me, f"Today I {act}, it was a great time.", tag)
        month = MONTHS[dates[s].month - 1]
        questions.append({"type": "temporal", "question": f"What did I do in {month} {dates[s].year}?", "tags": [tag]})
    # Distractors: other people doing similar things.
    for k in range(6):
        s = rng.randrange(n_sessions)
        who = rng.choice(others[5:])
        place(s, me, f"{who} said they might visit {rng.choice(CITIES)} someday.", None)
    # Fill sessions with chit-chat, interleaving user/assistant turns.
    chats, msg_no = [], 0
    for s in range(n_sessions):
        content = sessions[s]
        lines = []
        n_fill = rng.randint(4, 9)
        fills = [(me, rng.choice(FILLER_USER), None) for _ in range(n_fill)]
        merged = fills + content
        rng.shuffle(merged)
        t = dates[s]
        for speaker, text, tag in merged:
            lines.append((speaker, text, tag))
            lines.append(("Assistant", rng.choice(FILLER_BOT), None))
        for speaker, text, tag in lines:
            msg_no += 1
            mid = f"{uid}-m{msg_no}"
            t = t + dt.timedelta(minutes=rng.randint(1, 4))
            chats.append({"user_id": uid, "session_id": f"{uid}-s{s + 1}", "message_id": mid,
                          "speaker": speaker, "text": text, "at": t.strftime("%Y-%m-%dT%H:%M:%SZ"),
                          "_tag": tag})
    tag_ids = {}
    for c in chats:
        if c["_tag"]:
            tag_ids.setdefault(c["_tag"], []).append(c["message_id"])
        del c["_tag"]
    as_of = (dates[-1] + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    qs = []
    for i, q in enumerate(questions):
        ev = [m for t in q["tags"] for m in tag_ids[t]]
        qs.append({"user_id": uid, "qid": f"{uid}-q{i + 1}", "type": q["type"], "question": q["question"],
                   "evidence": ev, "as_of": as_of})
    return chats, qs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=12)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    start = dt.datetime(2023, 1, 5, 9, 0, 0)
    all_c, all_q = [], []
    for u in range(a.users):
        c, q = build_user(rng, f"eval{u + 1}", start + dt.timedelta(days=rng.randint(0, 60)))
        all_c += c
        all_q += q
    with open(f"{a.out}/chats.jsonl", "w") as f:
        for c in all_c:
            f.write(json.dumps(c) + "\n")
    with open(f"{a.out}/questions.jsonl", "w") as f:
        for q in all_q:
            f.write(json.dumps(q) + "\n")
    print(f"{len(all_c)} messages, {len(all_q)} questions")


if __name__ == "__main__":
    main()
