"""Word lists the task generators draw from: topics, forms, roles, people, items and follow-up turns, written for
this project (no benchmark's prompts). Each tuple is a pool; `generators` picks from them with a seeded RNG."""

WRITING_FORMS = (
    "a short poem", "a haiku", "a limerick", "a short story of about 150 words", "a persuasive paragraph",
    "a formal email", "a friendly letter", "a product description", "a blog post introduction", "a short speech",
    "a diary entry", "a news headline and a two-sentence summary", "a recipe introduction", "a motivational note",
    "a cover letter opening", "a travel postcard", "a riddle", "a dialogue between two friends",
    "a set of five tips", "an advertisement slogan and tagline",
)

TOPICS = (
    "autumn leaves", "a rainy Monday", "the first day at a new job", "learning to ride a bicycle", "a lighthouse",
    "the ocean at night", "a lost umbrella", "friendship", "city traffic", "a garden in spring", "moving house",
    "a forgotten birthday", "coffee", "a thunderstorm", "the last train home", "a cat who likes boxes",
    "a mountain hike", "an old library", "a robot learning to cook", "winter mornings", "a village market",
    "recycling", "a power cut", "space travel", "homework", "a broken phone", "a snowy holiday", "a kind stranger",
    "a school concert", "saving money", "sleep", "the smell of bread", "a rival chess player", "a river",
    "time management", "a messy kitchen", "a long-distance call", "a museum visit", "a desert road", "volunteering",
    "a music festival", "a lost dog found", "the moon", "a bakery at dawn", "a new neighbour", "exam week",
    "a beach clean-up", "a vintage camera", "learning a language", "a quiet park bench",
)

ROLES = (
    "a ship's captain", "a museum guide", "a medieval blacksmith", "a customer support agent", "a personal trainer",
    "a detective", "a chef in a busy restaurant", "a travel agent", "a librarian", "a job interviewer",
    "a science teacher", "a tour guide in Rome", "a pirate", "a park ranger", "a news anchor", "a wizard's apprentice",
    "a car mechanic", "a career coach", "a startup founder pitching to investors", "a nervous first-time pilot",
    "a hotel receptionist", "a shopkeeper in a small town", "a football coach at half time", "an astronaut on Mars",
)

ROLE_SITUATIONS = (
    "Greet me and ask how you can help.", "Explain what you do on a typical day.",
    "A customer is unhappy with a late delivery; respond to them.", "Give me advice about my first week.",
    "Describe the most surprising thing that happened to you this year.", "Convince me to try something new.",
    "I have just arrived. Tell me what I should know.", "Answer my question: what is the hardest part of your job?",
    "Tell me a short story from your past.", "Give me three rules I must follow.",
)

STEM_CONCEPTS = (
    "photosynthesis", "gravity", "the water cycle", "plate tectonics", "DNA replication", "the greenhouse effect",
    "electric current", "magnetism", "the speed of light", "black holes", "vaccines", "natural selection",
    "the periodic table", "chemical bonds", "friction", "sound waves", "the immune system", "climate and weather",
    "renewable energy", "nuclear fission", "the Pythagorean theorem", "prime numbers", "probability",
    "derivatives in calculus", "binary numbers", "machine learning", "encryption", "how a computer stores data",
    "how the internet routes packets", "entropy", "the Doppler effect", "tides", "volcanoes", "enzymes",
    "the solar system", "cell division", "acids and bases", "inertia", "electromagnetic waves", "ecosystems",
    "compound interest", "statistics and averages", "algorithms", "how batteries work", "the human heart",
)

HUMANITIES_TOPICS = (
    "the Renaissance", "the Industrial Revolution", "the printing press", "democracy in ancient Athens",
    "the Silk Road", "the fall of the Roman Empire", "the invention of writing", "the French Revolution",
    "utilitarianism", "stoicism", "the social contract", "existentialism", "the role of myths in societies",
    "the history of the alphabet", "impressionist painting", "the novel as a literary form", "Shakespeare's comedies",
    "the origins of jazz", "urbanisation", "the history of money", "human rights", "free will",
    "the ethics of lying", "the scientific revolution", "colonialism", "the Cold War", "world religions",
    "the purpose of museums", "public libraries", "the history of the Olympic Games", "architecture of cathedrals",
    "oral storytelling traditions", "the meaning of happiness", "the history of maps", "censorship",
)

LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese", "Russian",
             "Polish")

NAMES = ("Alice", "Ben", "Chloe", "Daniel", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam",
         "Maya", "Nikolai", "Olivia", "Priya", "Quentin", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wen", "Yusuf",
         "Zoe")

ITEMS = (("apples", "apple"), ("pencils", "pencil"), ("books", "book"), ("tickets", "ticket"),
         ("cupcakes", "cupcake"), ("marbles", "marble"), ("stickers", "sticker"), ("bottles of water", "bottle"),
         ("notebooks", "notebook"), ("oranges", "orange"), ("flowers", "flower"), ("coins", "coin"))

FOLLOW_UPS = {
    "writing": ("Now make it shorter and funnier.", "Rewrite it for a ten-year-old reader.",
                "Give it a title and explain your choice."),
    "roleplay": ("Stay in character and tell me what happens next.", "Now answer as if you were in a hurry.",
                 "What would you say to someone who disagrees with you?"),
    "reasoning": ("Explain your reasoning step by step.", "Are you sure? Check your answer again.",
                  "What assumption did you make?"),
    "math": ("Show how to check the answer.", "Now solve it a different way.",
             "What if every number were doubled?"),
    "coding": ("Add error handling to the code.", "Write two tests for it.", "What is its time complexity?"),
    "extraction": ("Now return the same information as a table.", "Which item is the most important, and why?",
                   "Sort the list alphabetically."),
    "stem": ("Give a real-world example.", "Explain it again in one sentence.",
             "What is a common misconception about it?"),
    "humanities": ("Why does it still matter today?", "Summarise the main points as a list.",
                   "Name one argument against this view."),
}
